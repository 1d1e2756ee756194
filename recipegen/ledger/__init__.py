"""The budget ledger: pure functions, the single source of every budget formula."""
