"""An OpenAI-compatible model server for tests and the demo: see ``model_server``."""
