"""The fixed prompt set of the real-engine tests (distinct prompts; prefix caching is off)."""

PROMPTS = [
    "the cat of the world is a big red stone",
    "one two three four five six seven",
    "agent call tool plan code run test error result",
    "a small bird in the cold night sky",
    "math proof of the sum value is the answer",
    "story poem of the sea and the wind and the rain",
]
MAX_TOKENS = 12
