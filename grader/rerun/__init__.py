"""The engine: run hand-in code in sandboxed gloo worlds and bring back what each rank returned."""
