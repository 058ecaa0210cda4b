"""LMDB storage: the engine, the group-commit writer, write ops, records."""
