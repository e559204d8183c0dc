"""`zeroserve bench`: load generators for OpenAI-compatible servers."""
