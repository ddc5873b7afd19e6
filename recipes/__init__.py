"""Training recipes: `python -m recipes.<name>`."""
