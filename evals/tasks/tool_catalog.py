"""A seeded catalogue of documented functions for the `agentic` task: each function has a JSON-schema doc in
BFCL's shape (evals.tasks.tool_calls), and a generator that draws one request for it with the call that
answers it (deterministic: every value the call needs is in the request or in the session's reference
facts), BFCL's possible answer for that call (an optional parameter the request leaves open may be left out
or given its documented default) and the function's result, a JSON object appended after the call.

Two functions read text (read_document, search_notes): their results carry a passage of the session's
haystack (WikiText-2 lines, evals.tasks.agentic), which is how a session grows to its length. Requests name
some values through the reference facts ("the number stored under amber-falcon-17"), so a call can depend on
a fact far back in the context.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from evals.tasks.tool_calls import Call, FunctionDoc, PossibleAnswer, render_calls

CITIES = ("Lisbon", "Osaka", "Denver", "Nairobi", "Oslo", "Lima", "Hanoi", "Perth", "Quebec", "Tunis")
CURRENCIES = ("USD", "EUR", "JPY", "GBP", "CHF", "CAD", "AUD", "SEK")
RESTAURANTS = ("Blue Harbor", "The Copper Pot", "Saffron House", "Green Table", "Luna Grill", "Old Mill Inn")
PEOPLE = ("Ana", "Raj", "Mei", "Tom", "Ines", "Kofi", "Lena", "Omar", "Sara", "Yuki")
ROOMS = ("living room", "bedroom", "kitchen", "office")
AIRPORTS = ("LIS", "KIX", "DEN", "NBO", "OSL", "LIM", "HAN", "PER", "YQB", "TUN")
TASKS = ("renew the parking permit", "call the plumber", "send the quarterly report", "water the plants",
         "book the dentist", "pay the electricity bill", "return the library books", "order printer paper")
TITLES = ("Budget review", "Team lunch", "Design sync", "Quarterly planning", "Vendor call", "Onboarding")
MESSAGES = ("Running ten minutes late", "The package has arrived", "Meeting moved to Friday", "Call me back please")
TOPICS = ("river transport", "harvest festivals", "old railways", "coastal storms", "market towns", "stone bridges")


@dataclass(frozen=True)
class Fact:
    """A reference fact of the session's context: "key: value"."""

    key: str
    value: str


@dataclass(frozen=True)
class ToolTurn:
    """One drawn request: what the user asks, the reference call(s), their possible answers, the result."""

    function: str
    request: str
    calls: tuple[Call, ...]
    answers: tuple[PossibleAnswer, ...]
    result: str  # the tool's reply (one JSON line)
    reads: bool  # the result carries a passage (a read function)
    source: str = ""  # where the turn comes from when not this catalogue (a BFCL entry id)

    @property
    def answer(self) -> str:
        """The reference answer: the call list on one line."""
        return render_calls(self.calls)


@dataclass(frozen=True)
class Draw:
    """What a generator may use: the session's generator, the facts it may name (each used once) and the
    passage a read function returns."""

    rng: random.Random
    facts: list[Fact]  # consumed from the end
    passage: Callable[[], str]


def _p(kind: str, text: str, **more: Any) -> dict[str, Any]:
    return {"type": kind, "description": text, **more}


def _doc(name: str, text: str, props: dict[str, dict[str, Any]], required: Sequence[str]) -> FunctionDoc:
    return {"name": name, "description": text,
            "parameters": {"type": "dict", "properties": props, "required": list(required)}}


def _date(rng: random.Random) -> str:
    return f"2025-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"


def _money(rng: random.Random) -> float:
    return rng.randrange(1000, 99999) / 100  # two decimals, e.g. 125.5


def _turn(name: str, request: str, args: dict[str, Any], allowed: dict[str, list[Any]], result: dict[str, Any],
          reads: bool = False) -> ToolTurn:
    return ToolTurn(name, request, (Call(name, args),), ({name: allowed},), json.dumps(result), reads)


def _weather(d: Draw) -> ToolTurn:
    city, days = d.rng.choice(CITIES), d.rng.randrange(1, 8)
    unit = d.rng.choice(("celsius", "fahrenheit", None))
    args: dict[str, Any] = {"city": city, "days": days}
    said = f" in {unit}" if unit else ""
    if unit:
        args["unit"] = unit
    highs = [d.rng.randrange(-5, 35) for _ in range(days)]
    return _turn("get_weather", f"What is the weather forecast for {city} for the next {days} days{said}?", args,
                 {"city": [city], "days": [days], "unit": [unit] if unit else ["celsius", ""]},
                 {"city": city, "unit": unit or "celsius", "daily_high": highs})


def _currency(d: Draw) -> ToolTurn:
    src, dst = d.rng.sample(CURRENCIES, 2)
    amount = _money(d.rng)
    rate = d.rng.randrange(50, 20000) / 1000
    return _turn("convert_currency", f"How much is {amount:.2f} {src} in {dst}?",
                 {"amount": amount, "from_currency": src, "to_currency": dst},
                 {"amount": [amount], "from_currency": [src], "to_currency": [dst]},
                 {"converted": round(amount * rate, 2), "rate": rate})


def _table(d: Draw) -> ToolTurn:
    place, size, date = d.rng.choice(RESTAURANTS), d.rng.randrange(2, 9), _date(d.rng)
    time = f"{d.rng.randrange(17, 22)}:{d.rng.choice(('00', '15', '30', '45'))}"
    return _turn("book_table", f"Book a table for {size} at {place} on {date} at {time}.",
                 {"restaurant": place, "party_size": size, "date": date, "time": time},
                 {"restaurant": [place], "party_size": [size], "date": [date], "time": [time]},
                 {"confirmation": f"BK-{d.rng.randrange(1000, 9999)}", "status": "booked"})


def _message(d: Draw) -> ToolTurn:
    fact, text = d.facts.pop(), d.rng.choice(MESSAGES)
    return _turn("send_message", f"Send the message '{text}' to the phone number stored under {fact.key} in the "
                 "reference facts.", {"recipient": fact.value, "text": text},
                 {"recipient": [fact.value], "text": [text]},
                 {"status": "sent", "message_id": f"m{d.rng.randrange(10**5, 10**6)}"})


def _order(d: Draw) -> ToolTurn:
    fact, items = d.facts.pop(), d.rng.random() < 0.5
    ask = ", with its items" if items else ""
    args: dict[str, Any] = {"order_id": int(fact.value)}
    if items:
        args["include_items"] = True
    return _turn("lookup_order", f"Look up the order whose number is stored under {fact.key} in the reference "
                 f"facts{ask}.", args, {"order_id": [int(fact.value)], "include_items": [True] if items else [False, ""]},
                 {"order_id": int(fact.value), "status": d.rng.choice(("shipped", "processing", "delivered")),
                  "total": _money(d.rng)})


def _event(d: Draw) -> ToolTurn:
    title, date, minutes = d.rng.choice(TITLES), _date(d.rng), d.rng.choice((15, 30, 45, 60, 90))
    people = d.rng.sample(PEOPLE, d.rng.randrange(0, 3))
    args: dict[str, Any] = {"title": title, "date": date, "duration_minutes": minutes}
    said = ""
    if people:
        args["attendees"] = people
        said = " with " + " and ".join(people)
    return _turn("create_event", f"Put '{title}' on the calendar on {date} for {minutes} minutes{said}.", args,
                 {"title": [title], "date": [date], "duration_minutes": [minutes],
                  "attendees": [people] if people else [[], ""]},
                 {"event_id": f"EV-{d.rng.randrange(100, 999)}", "status": "created"})


def _thermostat(d: Draw) -> ToolTurn:
    room, temp = d.rng.choice(ROOMS), d.rng.randrange(160, 260, 5) / 10
    mode = d.rng.choice(("heat", "cool", None))
    args: dict[str, Any] = {"room": room, "temperature": temp}
    said = f" in {mode} mode" if mode else ""
    if mode:
        args["mode"] = mode
    return _turn("set_thermostat", f"Set the {room} thermostat to {temp} degrees{said}.", args,
                 {"room": [room], "temperature": [temp], "mode": [mode] if mode else ["auto", ""]},
                 {"room": room, "target": temp, "mode": mode or "auto"})


def _flights(d: Draw) -> ToolTurn:
    src, dst = d.rng.sample(AIRPORTS, 2)
    date, stops = _date(d.rng), d.rng.choice((0, 2, None))
    args: dict[str, Any] = {"origin": src, "destination": dst, "date": date}
    said = ""
    if stops is not None:
        args["max_stops"] = stops
        said = " with no stops" if stops == 0 else f" with at most {stops} stops"
    offers = [{"flight": f"{src[:2]}{d.rng.randrange(100, 999)}", "price": _money(d.rng)} for _ in range(2)]
    return _turn("search_flights", f"Find flights from {src} to {dst} on {date}{said}.", args,
                 {"origin": [src], "destination": [dst], "date": [date],
                  "max_stops": [stops] if stops is not None else [1, ""]}, {"flights": offers})


def _todo(d: Draw) -> ToolTurn:
    task, prio = d.rng.choice(TASKS), d.rng.choice(("low", "medium", "high"))
    due = _date(d.rng) if d.rng.random() < 0.5 else None
    args: dict[str, Any] = {"title": task, "priority": prio}
    said = ""
    if due:
        args["due_date"] = due
        said = f", due {due}"
    return _turn("add_todo", f"Add a {prio} priority to-do: {task}{said}.", args,
                 {"title": [task], "priority": [prio], "due_date": [due] if due else [""]},
                 {"todo_id": d.rng.randrange(100, 999), "status": "added"})


def _transfer(d: Draw) -> ToolTurn:
    src, dst, amount = d.facts.pop(), d.facts.pop(), _money(d.rng)
    return _turn("transfer_funds", f"Transfer {amount:.2f} from the account stored under {src.key} to the account "
                 f"stored under {dst.key} (both numbers are in the reference facts).",
                 {"from_account": src.value, "to_account": dst.value, "amount": amount},
                 {"from_account": [src.value], "to_account": [dst.value], "amount": [amount]},
                 {"status": "done", "reference": f"TX{d.rng.randrange(10**6, 10**7)}"})


def _read(d: Draw) -> ToolTurn:
    doc_id = f"doc-{d.rng.randrange(100, 1000)}"
    return _turn("read_document", f"Open document {doc_id} and show me its text.", {"doc_id": doc_id},
                 {"doc_id": [doc_id]}, {"doc_id": doc_id, "text": d.passage()}, reads=True)


def _search(d: Draw) -> ToolTurn:
    topic, n = d.rng.choice(TOPICS), d.rng.choice((2, 5, None))
    args: dict[str, Any] = {"query": topic}
    said = ""
    if n is not None:
        args["max_results"] = n
        said = f", at most {n} results"
    return _turn("search_notes", f"Search my notes for '{topic}'{said}.", args,
                 {"query": [topic], "max_results": [n] if n is not None else [3, ""]},
                 {"results": [{"note": f"note-{d.rng.randrange(10, 99)}", "text": d.passage()}]}, reads=True)


@dataclass(frozen=True)
class Function:
    """One function of the catalogue: its doc, its request generator, the facts a request uses, whether it reads."""

    doc: FunctionDoc
    draw: Callable[[Draw], ToolTurn]
    facts: int = 0
    reads: bool = False


DATE = "date, YYYY-MM-DD"
CATALOGUE: tuple[Function, ...] = (
    Function(_doc("read_document", "Return the full text of a stored document.",
                  {"doc_id": _p("string", "document id, e.g. doc-123")}, ["doc_id"]), _read, reads=True),
    Function(_doc("search_notes", "Search the user's notes and return matching passages.",
                  {"query": _p("string", "what to search for"),
                   "max_results": _p("integer", "most results to return", default=3)}, ["query"]),
             _search, reads=True),
    Function(_doc("get_weather", "Daily weather forecast for a city.",
                  {"city": _p("string", "city name"), "days": _p("integer", "number of days, 1 to 7"),
                   "unit": _p("string", "temperature unit", enum=["celsius", "fahrenheit"], default="celsius")},
                  ["city", "days"]), _weather),
    Function(_doc("convert_currency", "Convert an amount of money from one currency to another.",
                  {"amount": _p("float", "amount to convert"), "from_currency": _p("string", "ISO code, e.g. USD"),
                   "to_currency": _p("string", "ISO code, e.g. EUR")}, ["amount", "from_currency", "to_currency"]),
             _currency),
    Function(_doc("book_table", "Reserve a restaurant table.",
                  {"restaurant": _p("string", "restaurant name"), "party_size": _p("integer", "number of guests"),
                   "date": _p("string", DATE), "time": _p("string", "time, HH:MM (24 h)")},
                  ["restaurant", "party_size", "date", "time"]), _table),
    Function(_doc("send_message", "Send a text message to a phone number.",
                  {"recipient": _p("string", "phone number, digits only"), "text": _p("string", "message text")},
                  ["recipient", "text"]), _message, facts=1),
    Function(_doc("lookup_order", "Look up an order by its number.",
                  {"order_id": _p("integer", "order number"),
                   "include_items": _p("boolean", "also list the order's items", default=False)}, ["order_id"]),
             _order, facts=1),
    Function(_doc("create_event", "Create a calendar event.",
                  {"title": _p("string", "event title"), "date": _p("string", DATE),
                   "duration_minutes": _p("integer", "length in minutes"),
                   "attendees": _p("array", "names of the people invited", items={"type": "string"}, default=[])},
                  ["title", "date", "duration_minutes"]), _event),
    Function(_doc("set_thermostat", "Set a room's thermostat.",
                  {"room": _p("string", "room", enum=list(ROOMS)), "temperature": _p("float", "degrees Celsius"),
                   "mode": _p("string", "operating mode", enum=["heat", "cool", "auto"], default="auto")},
                  ["room", "temperature"]), _thermostat),
    Function(_doc("search_flights", "Search flights between two airports on a date.",
                  {"origin": _p("string", "IATA code of the departure airport"),
                   "destination": _p("string", "IATA code of the arrival airport"), "date": _p("string", DATE),
                   "max_stops": _p("integer", "most stops allowed", default=1)}, ["origin", "destination", "date"]),
             _flights),
    Function(_doc("add_todo", "Add an item to the to-do list.",
                  {"title": _p("string", "what to do"),
                   "priority": _p("string", "priority", enum=["low", "medium", "high"]),
                   "due_date": _p("string", DATE)}, ["title", "priority"]), _todo),
    Function(_doc("transfer_funds", "Transfer money between two bank accounts.",
                  {"from_account": _p("string", "account number to debit"),
                   "to_account": _p("string", "account number to credit"), "amount": _p("float", "amount")},
                  ["from_account", "to_account", "amount"]), _transfer, facts=2),
)
BY_NAME = {f.doc["name"]: f for f in CATALOGUE}
READERS = tuple(f for f in CATALOGUE if f.reads)
ACTIONS = tuple(f for f in CATALOGUE if not f.reads)
