"""``python -m analysis.corpus``: record the side of every new case in split.json."""

from . import freeze_split, load_cases, side_of

written = freeze_split()
sides = [side_of(c, written) for c in load_cases()]
print(f"{sides.count('dev')} dev, {sides.count('test')} test")
