"""Operations endpoints: scheduler API, drains, reports, metrics (see issue 8)."""

urlpatterns: list = []
