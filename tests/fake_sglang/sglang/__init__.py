"""The SGLang server stand-in under SGLang's module name: `python -m sglang.launch_server` runs it."""
