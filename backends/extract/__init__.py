"""Hidden-state extraction for EAGLE-3 training: `python -m backends.extract --target DIR --data FILE|demo --out DIR`.

Chats are rendered with the target's chat template, masked to the assistant's
tokens, run through the target, and saved as shards in the layout of
`backends.eagle3_contract` with a manifest. Modules: `data` (reading chats),
`template` (tokens and loss mask), `capture` (the forward pass), `output`
(shards, progress, resume, manifest), `cli` (the command line and the loop).
"""
