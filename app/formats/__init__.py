"""Reading model files without loading them."""
