"""Natural-language chat prompts for benchmarks: distinct requests of about the same length.

Random-token prompts overstate n-gram drafts (the model continues them in loops) and say little
of a chat server's day. These are written requests: who asks, some context, what they want.
Each prompt opens with its own (asker, request, first paragraph), so prompts share no more than a
few prefix-cache blocks (the chat template's system prompt, an opening line), and is grown
paragraph by paragraph to the length asked for.
"""

from __future__ import annotations

import itertools
import re

import numpy as np

from service.bench.datasets import Endpoint, SampleRequest, prompt_body
from service.model_files.tokenizer import Tokenizer

_OPENERS = (
    "Hi, I'm a nurse working night shifts in Leeds.", "Hello! I teach history at a secondary school in Lyon.",
    "Good morning, I run a small bakery in Porto.", "Hey there, I'm a second-year engineering student.",
    "Hi, I volunteer at the public library on weekends.", "Hello, I'm a retired postman who loves gardening.",
    "Hi! I'm training for my first marathon this autumn.", "Good evening, I manage a team of six developers.",
    "Hello, I'm a freelance translator based in Madrid.", "Hi, I'm a parent of two curious primary school kids.",
    "Hey, I just moved to a flat with a tiny balcony.", "Hello! I'm a chemistry teacher preparing a new course.",
    "Hi, I work as a bus driver and read a lot on breaks.", "Good afternoon, I'm organising a village festival.",
    "Hello, I'm a junior accountant at a logistics firm.", "Hi, I'm writing my first novel in the evenings.",
    "Hey! I'm a hobby astronomer with a small telescope.", "Hello, I coach an under-twelve football team.",
    "Hi, I'm a software tester learning about databases.", "Good morning, I keep bees at the edge of town.",
    "Hello! I'm planning a cycling trip along the Danube.", "Hi, I'm a museum guide who loves old maps.",
    "Hey, I'm a carpenter thinking about starting a blog.", "Hello, I care for my elderly father at home.",
)

_PASSAGES = (
    "Last month I started keeping a notebook of everything I spend, and I was surprised by how much goes on "
    "small things like coffee, snacks and delivery fees. I would like to save for a proper holiday next year "
    "without feeling that I have to give up every little pleasure along the way.",
    "Our neighbourhood has an old community garden that nobody has looked after for years. A few of us want to "
    "bring it back to life, but we have very little money, no shed for tools, and we are not sure which "
    "vegetables would grow well in partly shaded beds with heavy clay soil.",
    "I have been reading about the history of the printing press and how it changed the way ideas spread "
    "across Europe. What fascinates me is how quickly pamphlets, maps and cheap books reached ordinary people, "
    "and how rulers and churches reacted to losing control over what was written.",
    "My team moved to working from home two days a week, and meetings have become longer and less useful. "
    "People talk over each other on video calls, decisions are not written down, and the same questions come "
    "back every week because nobody remembers what we agreed.",
    "I want to learn to cook healthier meals, but after work I am usually tired and end up eating toast or "
    "instant noodles. I have a small kitchen, one good pan, an oven that heats unevenly, and about forty "
    "minutes on most evenings.",
    "Recently I noticed that I sleep badly on the nights after I look at my phone in bed. I fall asleep late, "
    "wake up several times, and feel groggy in the morning even when I get eight hours. On weekends it is "
    "better, which makes me think my routine matters more than I assumed.",
    "Our school wants to start a small science club for children aged nine to eleven. We have a classroom on "
    "Wednesday afternoons, a modest budget for materials, and parents who are happy to help, but none of us "
    "has run a club like this before.",
    "I have started walking to work instead of taking the tram, which is about three kilometres each way. I "
    "enjoy it, but on rainy days I arrive soaked, and I wonder whether there are simple ways to make the walk "
    "more pleasant and to keep going through the winter.",
    "The town council is asking residents for ideas on how to make the high street livelier. Many shops have "
    "closed in the last five years, the market only runs on Saturdays, and young people say there is nowhere "
    "to meet in the evening that does not cost money.",
    "I recently inherited a box of letters that my grandparents wrote to each other during the years they "
    "lived in different countries. The paper is fragile, some ink has faded, and I would love to preserve them "
    "and perhaps turn them into something the whole family can read.",
    "At work we keep our customer records in several spreadsheets that different people edit, and they often "
    "disagree with each other. My manager asked me to suggest a better way to organise this information "
    "without buying an expensive system or training everyone for weeks.",
    "I would like to understand the night sky better. On clear evenings I can see a few bright stars and "
    "sometimes a planet, but I cannot tell which is which, and I do not know when the best times are to look "
    "for meteor showers or the rings of Saturn.",
)

_REQUESTS = (
    "Could you give me a short, practical plan with a few concrete steps I could start this week?",
    "What would you suggest I try first, and what mistakes should I avoid?",
    "Can you explain the main ideas simply and then suggest where I could learn more?",
    "Please list the three most important things to consider, with a sentence on each.",
    "How would you approach this if you were in my position, and why?",
    "Could you write a friendly summary I could share with the others involved?",
    "What questions should I be asking myself before I decide anything?",
    "Can you suggest a simple weekly routine that would help with this?",
)


def chat_sentences() -> list[str]:
    """Every sentence the prompts are made of: the askers, their requests, the background passages' sentences."""
    return [*_OPENERS, *_REQUESTS, *(s for passage in _PASSAGES for s in re.split(r"(?<=[.?!]) ", passage))]


def chat_prompts(tokenizer: Tokenizer, num_prompts: int, input_len: int, seed: int = 0) -> list[str]:
    """`num_prompts` distinct user messages of about `input_len` tokens (at most, once the chat template
    is applied): who asks, what they want, then background paragraphs in an order of their own."""
    rng = np.random.default_rng(seed)
    triples = list(itertools.product(range(len(_OPENERS)), range(len(_REQUESTS)), range(len(_PASSAGES))))
    if num_prompts > len(triples):
        raise ValueError(f"at most {len(triples)} distinct chat prompts, asked for {num_prompts}")
    prompts = []
    for index in rng.permutation(len(triples))[:num_prompts]:
        opener, request, first = triples[index]
        rest = [passage for passage in rng.permutation(len(_PASSAGES)) if passage != first]
        text = f"{_OPENERS[opener]} {_REQUESTS[request]} Some background: {_PASSAGES[first]}"
        for passage in rest:
            candidate = f"{text} {_PASSAGES[passage]}"
            if _chat_len(tokenizer, candidate) > input_len:
                break
            text = candidate
        prompts.append(text)
    return prompts


def chat_dataset(
    tokenizer: Tokenizer, endpoint: Endpoint, num_prompts: int, input_len: int, output_len: int, seed: int = 0
) -> list[SampleRequest]:
    """The chat prompts as requests for `bench serve`."""
    return [
        SampleRequest(prompt_body(endpoint, text, output_len), _chat_len(tokenizer, text), output_len)
        for text in chat_prompts(tokenizer, num_prompts, input_len, seed)
    ]


def _chat_len(tokenizer: Tokenizer, text: str) -> int:
    messages = [{"role": "user", "content": text}]
    if tokenizer.chat_template is None:
        return len(tokenizer.encode(text, add_special_tokens=True))
    return len(tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=True))
