"""Model kinds: what each kind can do (tasks.py), and the kinds beyond language models (vision,
embeddings, transcription, speech). Their names, and what kind of model a folder holds, are the
store's: engine/files/kinds.py."""
