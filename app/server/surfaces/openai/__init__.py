"""The OpenAI surface (surface.py): chat, completions, embeddings, audio, images, rerank."""
