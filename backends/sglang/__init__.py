"""SGLang, the serving engine: the only package that knows its flags, log lines, releases and runtime."""
