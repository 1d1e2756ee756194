"""Recipe loading: YAML -> a typed, cross-checked recipe (catalog names resolved, model files and
row maps read and checked against the declared budget), and the write-back of `active_class`.

Sits above the ledger: the row-map check compares a map with the split the budget declares
(`recipegen.ledger.budget.declared_split`); the ledger itself works on typed recipes and never reads
a file.
"""
