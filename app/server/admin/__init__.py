"""The admin API: one module per resource (`routes`, a `TAG`), each added to the app factory in one line."""
