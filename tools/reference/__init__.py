"""docs/reference/, generated from the code: `make reference` writes the pages and
tests/unit/test_reference_docs.py fails when a committed page differs (see pages.PAGES)."""
