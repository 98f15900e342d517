"""Discovery and symbols: which kernel functions a glob means, their types, and names for addresses."""
