"""The prompt sets of `slotserve bench tools`: requests that need one of TOOLS (each with the
function a right answer calls) and requests that need none (a call there is a false call)."""

from __future__ import annotations

from typing import Any


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    params = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


TOOLS: list[dict[str, Any]] = [
    _tool("get_weather", "Get the current weather in a city", {"city": {"type": "string"}}, ["city"]),
    _tool(
        "get_time",
        "Get the current local time in a city",
        {"city": {"type": "string", "description": "the city, e.g. Tokyo"}},
        ["city"],
    ),
    _tool(
        "convert_currency",
        "Convert an amount of money from one currency to another",
        {
            "amount": {"type": "number"},
            "from_currency": {"type": "string", "description": "ISO code, e.g. USD"},
            "to_currency": {"type": "string", "description": "ISO code, e.g. EUR"},
        },
        ["amount", "from_currency", "to_currency"],
    ),
]

NEEDS_TOOL: list[tuple[str, str]] = [
    ("What's the weather in Paris?", "get_weather"),
    ("Is it raining in London right now?", "get_weather"),
    ("How hot is it in Tokyo today?", "get_weather"),
    ("Tell me the current temperature in New York.", "get_weather"),
    ("Should I bring an umbrella in Seattle today?", "get_weather"),
    ("What's the weather like in Berlin?", "get_weather"),
    ("Check the weather in Sydney for me.", "get_weather"),
    ("How cold is it in Moscow?", "get_weather"),
    ("Is it sunny in Rome?", "get_weather"),
    ("weather in Cairo?", "get_weather"),
    ("Give me the weather conditions in Toronto.", "get_weather"),
    ("Do I need a jacket in Chicago today?", "get_weather"),
    ("What's the humidity in Singapore?", "get_weather"),
    ("Is it snowing in Oslo?", "get_weather"),
    ("What time is it in Tokyo?", "get_time"),
    ("What's the current time in London?", "get_time"),
    ("Tell me the time in New York.", "get_time"),
    ("What time is it now in Sydney?", "get_time"),
    ("Current local time in Berlin?", "get_time"),
    ("What's the time in Los Angeles right now?", "get_time"),
    ("Is it morning or evening in Dubai now?", "get_time"),
    ("What time is it in Paris?", "get_time"),
    ("Can you tell me the local time in Mumbai?", "get_time"),
    ("Time in Sao Paulo please.", "get_time"),
    ("Convert 100 US dollars to euros.", "convert_currency"),
    ("How much is 50 euros in Japanese yen?", "convert_currency"),
    ("What is 250 GBP in USD?", "convert_currency"),
    ("Convert 1000 yen to dollars.", "convert_currency"),
    ("How many euros is 75 Swiss francs?", "convert_currency"),
    ("Exchange 20 dollars into pounds.", "convert_currency"),
    ("I have 300 Canadian dollars, how much is that in euros?", "convert_currency"),
    ("What's 1200 Indian rupees in US dollars?", "convert_currency"),
    ("How much are 40 Australian dollars in New Zealand dollars?", "convert_currency"),
    ("Change 15 euros to dollars.", "convert_currency"),
    ("What's the weather in Lisbon and should I wear shorts?", "get_weather"),
    ("Please look up the weather for Amsterdam.", "get_weather"),
    ("I'm flying to Bangkok, what's the weather there?", "get_weather"),
    ("My friend is in Seoul. What time is it for her?", "get_time"),
    ("How late is it in Hong Kong at the moment?", "get_time"),
    ("Convert 9.99 USD to GBP.", "convert_currency"),
]

NO_TOOL: list[str] = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain what a linked list is.",
    "What is 2 + 2?",
    "Translate 'good morning' to Spanish.",
    "Who wrote Romeo and Juliet?",
    "Write a haiku about the sea.",
    "What does HTTP stand for?",
    "How do I sort a list in Python?",
    "Explain recursion in one sentence.",
    "What is the boiling point of water in Celsius?",
    "Give me a synonym for happy.",
    "Write a SQL query that counts the rows of a table named users.",
    "What is a prime number?",
    "Summarize the plot of Cinderella in two sentences.",
    "How many days are in a leap year?",
    "What is the difference between a list and a tuple in Python?",
    "Name three primary colors.",
    "Write a bash command that lists the files of a directory.",
    "What is the square root of 144?",
]
