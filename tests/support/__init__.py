"""Helpers the tests share: stubs, strategies, the job on the test bed, waiting."""
