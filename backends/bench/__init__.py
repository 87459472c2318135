"""`bench`: a served draft driven through SGLang's OpenAI-compatible API from the host; SGLang `bench_serving`'s
figures with its definitions, and SGLang's acceptance length per request, stored beside the served run
(bench.jsonl)."""
