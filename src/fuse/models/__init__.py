"""Wire records shared by the server and the SDK (pydantic v2)."""
