"""Remote lanes: OpenAI-compatible endpoints on other machines, served through the gateway like local ones."""
