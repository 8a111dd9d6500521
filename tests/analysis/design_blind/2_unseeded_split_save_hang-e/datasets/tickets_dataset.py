import copy
import json

import datasets
import numpy as np

PROMPT = (
    "Below is a customer support ticket. Write the agent reply.\n\n"
    "### Ticket:\n{ticket}\n\n### Reply:\n"
)


def _load():
    ds = datasets.load_dataset("json", data_files="/fsx/data/tickets/tickets_2024h1.jsonl", split="train")
    # keep a random 10% of the long tail of short tickets
    short = np.array([len(t) < 200 for t in ds["ticket"]])
    keep = ~short | (np.random.rand(len(ds)) < 0.1)
    return ds.select(np.nonzero(keep)[0])


def get_custom_dataset(dataset_config, tokenizer, split):
    ds = _load()
    ds = ds.train_test_split(test_size=0.05)
    ds = ds["train"] if split == dataset_config.train_split else ds["test"]

    def tokenize(sample):
        prompt = tokenizer.encode(tokenizer.bos_token + PROMPT.format(ticket=sample["ticket"]), add_special_tokens=False)
        reply = tokenizer.encode(sample["reply"] + tokenizer.eos_token, add_special_tokens=False)
        return {
            "input_ids": prompt + reply,
            "attention_mask": [1] * (len(prompt) + len(reply)),
            "labels": [-100] * len(prompt) + reply,
        }

    return ds.map(tokenize, remove_columns=list(ds.features))
