"""`bench`: a served draft driven through SGLang's OpenAI-compatible API from the host, its acceptance length,
output rate, time to first token and inter-token latency stored beside the served run (bench.jsonl)."""
