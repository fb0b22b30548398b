"""The REST API and dashboard over the engine. Importing it imports neither torch, triton nor ray."""
