"""The training corpus of the embedded default tokenizer, written by the project in code.

Everything here is generated in memory from small word lists and fixed patterns with a seeded
``random.Random``: English-like prose, code in a few languages, JSON tool calls and results,
numbers, whitespace runs (indentation, tabs, blank lines, CRLF) and non-ASCII text (accents,
combining marks, Greek, Cyrillic, CJK, emoji including ZWJ sequences).  No upstream text is
read or copied.  The same seed gives the same documents, byte for byte, on every Python
version that keeps ``random.Random``'s seeded sequence (``random()``, ``getrandbits``) stable.

Only ordered containers are iterated (never sets or dict views of hashed keys built at
run time), so string-hash randomization cannot change the output.
"""

from __future__ import annotations

import json
import random

#: Seed of the default corpus; changing it (or anything below) changes the tokenizer.
DEFAULT_SEED = 20250101
#: Approximate target size of the default corpus in UTF-8 bytes.
DEFAULT_TARGET_BYTES = 240_000

# -- word lists (written for this file) ----------------------------------------------------------

NAMES = (
    "Ada", "Bram", "Chen", "Dara", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kemi", "Lior",
    "Mira", "Nils", "Oona", "Pavel", "Quinn", "Rosa", "Sami", "Tove", "Uma", "Vik", "Wren", "Yara", "Zane",
    "Alma", "Boris", "Carmen", "Dmitri", "Elif", "Femi", "Greta", "Hugo", "Ines", "Jonas", "Kaito", "Leila",
    "Marco", "Nadia", "Omar", "Priya", "Rafael", "Sofia", "Tariq", "Ulla", "Vera", "Wanda", "Xavier", "Yusuf",
)
# Nouns: the plural is regular (+s, +es after s/x/z/ch/sh, y -> ies) unless written "singular:plural".
NOUNS = tuple(dict.fromkeys("""
server model request token prompt answer question file folder table river mountain city garden window
kitchen library market station bridge letter message report budget schedule meeting project team customer
order engine battery signal network cache queue thread process memory device weather forecast temperature
price ticket flight hotel recipe dinner coffee book story chapter song picture camera bicycle street village
island computer keyboard screen printer phone cable switch router disk drive folder archive backup record
database query index column row field value number string list array object function method class module
package library version release update patch branch commit review test error warning exception bug feature
option setting profile account password email address contact friend family child:children person:people
teacher student doctor nurse driver pilot farmer artist writer reader player coach manager engineer designer
developer scientist neighbor visitor guest owner worker author editor judge lawyer cook baker
house room door wall floor roof stair chair desk lamp bed shelf:shelves box bag bottle glass cup plate bowl spoon knife:knives
fork tree flower leaf:leaves grass seed forest field hill valley lake ocean beach shore wave storm cloud rain
snow wind sun moon star sky planet world country region border road path trail map compass
car bus train boat ship plane truck wheel road tunnel harbor airport
breakfast lunch bread cheese apple orange lemon tomato:tomatoes potato:potatoes onion rice soup salad cake cookie tea
juice milk water sugar salt pepper butter egg
morning evening night week month year hour minute second moment season holiday weekend birthday
music movie game sport team match goal score ball race prize medal
idea plan problem solution reason result method system structure pattern rule law policy decision choice
change difference example detail feature quality quantity amount level rate speed distance size weight
color shape sound voice word sentence paragraph page note language dictionary translation meaning
company office factory store shop bank school university hospital museum theater church garden park
wolf:wolves fox horse cow sheep:sheep bird fish:fish cat dog mouse:mice rabbit bear lion tiger
""".split()))
ADJECTIVES = tuple(dict.fromkeys("""
small large quick slow bright quiet careful simple strange useful early late warm cold green blue red old new
empty full short long heavy light clear busy calm broken stable fast safe final happy sad angry tired
hungry rich poor cheap expensive easy hard difficult important famous popular modern ancient young fresh
dark deep wide narrow thin thick soft loud sharp smooth rough clean dirty dry wet sweet bitter sour
strong weak brave gentle kind polite honest patient curious clever wise silly funny serious strict
correct wrong true false real possible private public local global special general common rare
main total basic complete perfect certain obvious similar different available visible hidden
open closed ready free secure valid invalid remote internal external recent previous current next
""".split()))
# Verbs: regular unless written "base:past" (the -ing form drops a final silent e and doubles the
# final consonant of the verbs in DOUBLING).
VERBS = tuple(dict.fromkeys("""
read:read write:wrote build:built check send:sent open close find:found keep:kept move start stop:stopped
return load save count sort print parse render carry follow answer explain describe measure repair watch visit
ask help need want like love hate hope wish try call walk talk work play jump climb cook clean wash paint
learn teach:taught study listen watch look show test fix mix add remove change create delete update install
run:ran swim:swam sing:sang drink:drank eat:ate sleep:slept drive:drove ride:rode speak:spoke break:broke
choose:chose freeze:froze forget:forgot give:gave take:took make:made bring:brought buy:bought think:thought
teach:taught catch:caught sell:sold tell:told hold:held stand:stood understand:understood lose:lost
leave:left meet:met feel:felt pay:paid say:said hear:heard win:won begin:began know:knew grow:grew
throw:threw fly:flew draw:drew see:saw come:came become:became get:got let:let put:put set:set cut:cut
plan:planned drop:dropped ship:shipped shop:shopped travel arrive decide receive share compare prepare
store improve include increase reduce allow accept expect explain collect connect protect select
report request deliver discover remember consider order offer enter enjoy employ destroy reply:replied
copy:copied apply:applied study:studied worry:worried hurry:hurried cancel finish wait turn push pull
""".split()))
ADVERBS = tuple("""
quickly slowly carefully quietly again today yesterday tomorrow soon always never often rarely finally
together alone early later twice almost already also still just only really very quite rather usually
sometimes certainly probably perhaps nearly exactly simply clearly easily suddenly recently everywhere
""".split())
PREPOSITIONS = ("in", "on", "under", "near", "behind", "after", "before", "with", "without", "across",
                "through", "into", "onto", "from", "about", "between", "around", "along", "beside", "inside",
                "outside", "above", "below", "during", "against", "toward", "beyond", "among", "for", "at")
DETERMINERS = ("the", "a", "this", "that", "every", "each", "our", "their", "my", "your", "one", "his", "her",
               "its", "another", "the same", "the other", "no")
PLURAL_DETERMINERS = ("the", "these", "those", "some", "many", "few", "several", "all", "both", "two", "three",
                      "ten", "our", "their", "most", "other", "such")
CONNECTIVES = ("and", "but", "so", "because", "while", "although", "then", "since", "until", "unless",
               "when", "after", "before", "if", "whereas", "or")
OPENERS = (
    "However", "Meanwhile", "In short", "For example", "Of course", "Later", "At first", "In the end",
    "Honestly", "Still", "Next", "Also", "Then", "Therefore", "Otherwise", "Instead", "Besides", "Afterwards",
    "In fact", "As a result", "On the other hand", "Unfortunately", "Luckily", "Surprisingly",
)
DOUBLING = ("run", "swim", "begin", "win", "cut", "get", "put", "set", "let", "forget", "stop", "plan", "drop",
            "ship", "shop")
INTENSIFIERS = ("very", "quite", "rather", "really", "almost", "fairly", "truly")
MODALS = ("can", "could", "will", "would", "should", "might", "must", "may")
QUESTION_WORDS = ("What", "Where", "When", "Why", "How", "Which", "Who")
CONTRACTED_OPENERS = (
    "It's clear that", "I'm sure that", "We're told that", "They've seen that", "Don't forget that",
    "You'll notice that", "She'd say that", "It isn't true that", "He won't admit that", "I can't believe that",
    "Let's assume that", "There's a chance that", "We'd hoped that", "Who'd have thought that",
)
# Syllables for invented place and product names (English-looking, not real words).
ONSETS = ("b", "br", "c", "ch", "cl", "d", "dr", "f", "fl", "g", "gr", "h", "j", "k", "l", "m", "n", "p", "pl",
          "pr", "qu", "r", "s", "sh", "st", "str", "t", "th", "tr", "v", "w", "z")
NUCLEI = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "oa", "ou", "y")
CODAS = ("", "", "n", "r", "l", "s", "t", "m", "nd", "rk", "st", "ng", "x", "ck", "th")
NAME_ENDINGS = ("ton", "ville", "burg", "field", "ford", "wick", "mere", "dale", "port", "ia", "ica", "ex", "ly", "io")


def _plural(noun: str) -> str:
    if ":" in noun:
        return noun.split(":")[1]
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def _singular(noun: str) -> str:
    return noun.split(":")[0]


def _verb_forms(verb: str) -> tuple[str, str, str, str]:
    """``(base, third person, past, -ing)``."""
    base, _, past = verb.partition(":")
    third = _plural(base) if base not in ("have", "do", "go") else {"have": "has", "do": "does", "go": "goes"}[base]
    if not past:
        if base.endswith("e"):
            past = base + "d"
        elif base.endswith("y") and base[-2] not in "aeiou":
            past = base[:-1] + "ied"
        else:
            past = base + "ed"
    if base in DOUBLING:
        ing = base + base[-1] + "ing"
    elif base.endswith("e") and not base.endswith(("ee", "ye")) and len(base) > 2:
        ing = base[:-1] + "ing"
    else:
        ing = base + "ing"
    return base, third, past, ing


VERB_FORMS = tuple(_verb_forms(v) for v in VERBS)


IDENTIFIERS = (
    "value", "items", "count", "index", "result", "config", "buffer", "offset", "length", "name",
    "path", "data", "user", "total", "limit", "state", "prompt", "tokens", "batch", "request", "reply",
)
TYPES = ("int", "str", "float", "bool", "bytes", "list[int]", "dict[str, int]", "None")
FUNCTIONS = (
    "get_weather", "search_files", "read_file", "send_email", "convert_currency", "lookup_flight",
    "create_event", "run_query", "translate_text", "calculate", "set_timer", "list_directory",
)
UNITS = ("kg", "km", "ms", "MB", "GB", "s", "m", "cm", "%", "°C", "€", "$")

# Non-ASCII material: accented words (precomposed), combining-mark spellings, other scripts.
ACCENTED = (
    "café", "naïve", "résumé", "déjà vu", "façade", "über", "Zürich", "München", "señor", "mañana",
    "São Paulo", "coração", "Ångström", "smørrebrød", "Kraków", "Łódź", "İstanbul", "Dvořák",
    "crème brûlée", "fiancée", "Malmö", "Reykjavík", "Bogotá", "Curaçao", "piñata", "jalapeño",
)
COMBINING = (
    "e\u0301", "a\u0300", "o\u0308", "n\u0303", "c\u0327", "u\u0308", "i\u0302", "a\u030a",
    "z\u030c", "s\u0323\u0307", "A\u0304", "g\u0306",
)
GREEK = ("καλημέρα", "ευχαριστώ", "θάλασσα", "λόγος", "φως", "ψυχή", "Αθήνα", "αλφάβητο")
CYRILLIC = ("привет", "спасибо", "город", "время", "работа", "книга", "Москва", "хорошо", "вопрос")
ARABIC = ("مرحبا", "شكرا", "كتاب", "مدينة", "سلام")
HEBREW = ("שלום", "תודה", "ספר", "עיר")
DEVANAGARI = ("नमस्ते", "धन्यवाद", "भारत", "किताब")
CJK_CHARS = (
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可里后小么"
    "心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长"
)
HIRAGANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをん"
KATAKANA = "アイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲン"
HANGUL = ("안녕하세요", "감사합니다", "서울", "사람", "시간", "학교", "컴퓨터")
EMOJI = (
    "😀", "😂", "🙂", "🤔", "👍", "🎉", "🔥", "✨", "🚀", "🌍", "☕", "📦", "✅", "❌", "⚠️", "❤️",
    "👍🏽", "👋🏻", "👩\u200d💻", "👨\u200d👩\u200d👧", "🏳️\u200d🌈", "🇯🇵", "🇧🇷", "1️⃣",
)
SYMBOLS = ("→", "←", "≤", "≥", "≠", "±", "×", "÷", "…", "—", "–", "“", "”", "‘", "’", "«", "»", "•", "§", "©", "°", "µ")


# -- generators ----------------------------------------------------------------------------------

def invented_name(r: random.Random) -> str:
    word = "".join(r.choice(ONSETS) + r.choice(NUCLEI) for _ in range(r.randint(1, 2))) + r.choice(CODAS)
    if r.random() < 0.5:
        word += r.choice(NAME_ENDINGS)
    return word.capitalize()


def _noun_phrase(r: random.Random) -> tuple[str, bool]:
    """A noun phrase and whether it is plural."""
    plural = r.random() < 0.35
    noun = r.choice(NOUNS)
    parts = [r.choice(PLURAL_DETERMINERS if plural else DETERMINERS)]
    if r.random() < 0.2:
        parts.append(r.choice(INTENSIFIERS))
    if r.random() < 0.5:
        adj = r.choice(ADJECTIVES)
        if r.random() < 0.15 and len(adj) <= 6:
            suffix = r.choice(("er", "est"))
            adj = adj[:-1] + "i" + suffix if adj.endswith("y") else adj + suffix[adj.endswith("e"):]
        parts.append(adj)
    parts.append(_plural(noun) if plural else _singular(noun))
    if parts[0] == "a" and parts[1][0] in "aeiou":
        parts[0] = "an"
    if r.random() < 0.1:
        parts += ["of", invented_name(r)]
    return " ".join(parts), plural


def _subject(r: random.Random) -> tuple[str, bool]:
    k = r.random()
    if k < 0.25:
        return r.choice(NAMES), False
    if k < 0.35:
        return r.choice(("I", "we", "you", "they")), True
    if k < 0.42:
        return r.choice(("he", "she", "it")), False
    return _noun_phrase(r)


def _clause(r: random.Random) -> str:
    subject, plural = _subject(r)
    base, third, past, ing = r.choice(VERB_FORMS)
    tense = r.randrange(6)
    if tense == 0:
        verb = base if plural else third
    elif tense == 1:
        verb = past
    elif tense == 2:
        verb = f"{r.choice(MODALS)} {base}"
    elif tense == 3:
        aux = ("are" if subject != "I" else "am") if plural else "is"
        verb = f"{r.choice((aux, 'was' if not plural or subject == 'I' else 'were'))} {ing}"
    elif tense == 4:
        verb = f"{'have' if plural else 'has'} {past}"
    else:
        verb = f"{r.choice(('did not', 'does not' if not plural else 'do not', 'will not'))} {base}"
    words = [subject, verb, _noun_phrase(r)[0]]
    if r.random() < 0.5:
        words += [r.choice(PREPOSITIONS), _noun_phrase(r)[0] if r.random() < 0.85 else invented_name(r)]
    if r.random() < 0.3:
        words.append(r.choice(ADVERBS))
    return " ".join(words)


def sentence(r: random.Random) -> str:
    kind = r.random()
    if kind < 0.12:
        np_, plural = _noun_phrase(r)
        aux = r.choice(("do" if plural else "does", "did", "will", "can", "should"))
        return f"{r.choice(QUESTION_WORDS)} {aux} {np_} {r.choice(VERB_FORMS)[0]}?"
    text = _clause(r)
    if r.random() < 0.35:
        text += f"{',' if r.random() < 0.3 else ''} {r.choice(CONNECTIVES)} {_clause(r)}"
    if r.random() < 0.12:
        text = f"{r.choice(CONTRACTED_OPENERS)} {text}"
    elif r.random() < 0.2:
        text = f"{r.choice(OPENERS)}, {text}"
    text = text[0].upper() + text[1:]
    if r.random() < 0.1:
        text += f" ({r.randint(2, 99)} {_plural(r.choice(NOUNS))})"
    return text + r.choice((".", ".", ".", ".", "!", "...", ";", ":"))


def paragraph(r: random.Random) -> str:
    return " ".join(sentence(r) for _ in range(r.randint(2, 6)))


def prose(r: random.Random) -> str:
    paras = [paragraph(r) for _ in range(r.randint(1, 4))]
    if r.random() < 0.3:
        paras.insert(r.randint(0, len(paras)), "\n".join(f"- {sentence(r)}" for _ in range(r.randint(2, 5))))
    if r.random() < 0.2:
        paras.insert(0, f"# {_noun_phrase(r)[0].title()}")
    return "\n\n".join(paras)


def number(r: random.Random) -> str:
    k = r.randrange(10)
    if k == 0:
        return str(r.randint(0, 9))
    if k == 1:
        return str(r.randint(10, 9999))
    if k == 2:
        return f"{r.randint(1, 999999):,}"
    if k == 3:
        return f"{r.uniform(-1000, 1000):.{r.randint(1, 4)}f}"
    if k == 4:
        return f"{r.randint(1990, 2035)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"
    if k == 5:
        return f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}:{r.randint(0, 59):02d}"
    if k == 6:
        return f"0x{r.getrandbits(32):08x}"
    if k == 7:
        return f"{r.uniform(0, 1):.3e}"
    if k == 8:
        return f"+{r.randint(1, 99)} {r.randint(100, 999)} {r.randint(1000, 9999)}"
    return f"{r.randint(0, 100)}{r.choice(UNITS)}"


def numbers_text(r: random.Random) -> str:
    lines = []
    for _ in range(r.randint(3, 10)):
        if r.random() < 0.4:
            a, b = r.randint(0, 999), r.randint(0, 999)
            op = r.choice("+-*")
            res = a + b if op == "+" else a - b if op == "-" else a * b
            lines.append(f"{a} {op} {b} = {res}")
        else:
            lines.append(f"The {_singular(r.choice(NOUNS))} {r.choice(('costs', 'weighs', 'took', 'measured', 'reached'))} {number(r)}.")
    if r.random() < 0.5:
        lines.append(", ".join(number(r) for _ in range(r.randint(3, 8))))
    return "\n".join(lines)


def _python(r: random.Random) -> str:
    fn = r.choice(IDENTIFIERS) + "_" + r.choice(IDENTIFIERS)
    a, b = r.sample(IDENTIFIERS, 2)
    ind = " " * r.choice((4, 4, 2))
    body = [
        f"def {fn}({a}: {r.choice(TYPES)}, {b}: {r.choice(TYPES)} = {r.randint(0, 64)}) -> {r.choice(TYPES)}:",
        f'{ind}"""{sentence(r)}"""',
        f"{ind}{r.choice(IDENTIFIERS)} = []",
        f"{ind}for i in range(len({a})):",
        f"{ind * 2}if {a}[i] > {b}:",
        f"{ind * 3}{r.choice(IDENTIFIERS)}.append({a}[i] * {r.randint(2, 9)})",
        f"{ind * 2}elif i % {r.randint(2, 5)} == 0:",
        f"{ind * 3}continue",
        f"{ind}return {r.choice(IDENTIFIERS)}",
    ]
    if r.random() < 0.5:
        body = ["import json", "from pathlib import Path", "", ""] + body
    if r.random() < 0.5:
        body += ["", "", "class " + _singular(r.choice(NOUNS)).title() + "Store:",
                 f"{ind}def __init__(self, {a}):", f"{ind * 2}self.{a} = {a}",
                 f"{ind * 2}self._{b} = {{}}  # {sentence(r)}"]
    return "\n".join(body)


def _javascript(r: random.Random) -> str:
    a, b = r.sample(IDENTIFIERS, 2)
    return "\n".join([
        f"export async function {a}{b.title()}({a}, {{ {b} = {r.randint(1, 100)} }} = {{}}) {{",
        f"  const res = await fetch(`/api/{_plural(r.choice(NOUNS))}/${{{a}}}`);",
        "  if (!res.ok) {",
        f"    throw new Error(\"{sentence(r)}\");",
        "  }",
        f"  return (await res.json()).filter((x) => x.{b} >= {r.randint(0, 9)});",
        "}",
    ])


def _shell(r: random.Random) -> str:
    return "\n".join([
        "#!/usr/bin/env bash",
        "set -euo pipefail",
        f"for f in ./{_plural(r.choice(NOUNS))}/*.txt; do",
        f"\tgrep -c '{r.choice(IDENTIFIERS)}' \"$f\" >> /tmp/{r.choice(IDENTIFIERS)}.log",
        "done",
        f"echo \"done: $(wc -l < /tmp/{r.choice(IDENTIFIERS)}.log)\"",
    ])


def _c_like(r: random.Random) -> str:
    a, b = r.sample(IDENTIFIERS, 2)
    return "\n".join([
        "#include <stdio.h>",
        "",
        f"static int {a}_{b}(const int *{a}, size_t n) {{",
        f"\tint {b} = 0;",
        "\tfor (size_t i = 0; i < n; ++i) {",
        f"\t\t{b} += {a}[i] & 0x{r.getrandbits(8):02x};",
        "\t}",
        f"\treturn {b};",
        "}",
    ])


def _sql(r: random.Random) -> str:
    t = _plural(r.choice(NOUNS))
    return (f"SELECT {r.choice(IDENTIFIERS)}, COUNT(*) AS n\nFROM {t}\nWHERE {r.choice(IDENTIFIERS)} > {r.randint(0, 500)}\n"
            f"GROUP BY 1\nORDER BY n DESC\nLIMIT {r.randint(1, 50)};")


def code(r: random.Random) -> str:
    kind = r.randrange(5)
    snippet = (_python, _javascript, _shell, _c_like, _sql)[kind](r)
    if r.random() < 0.4:
        lang = ("python", "javascript", "bash", "c", "sql")[kind]
        return f"{sentence(r)}\n\n```{lang}\n{snippet}\n```\n"
    return snippet


def _json_value(r: random.Random, depth: int = 0):
    k = r.randrange(7 if depth < 2 else 5)
    if k == 0:
        return r.randint(-100, 10000)
    if k == 1:
        return round(r.uniform(-50, 50), r.randint(1, 3))
    if k == 2:
        return r.choice((True, False, None))
    if k in (3, 4):
        return r.choice((_singular(r.choice(NOUNS)), r.choice(NAMES), r.choice(ACCENTED), sentence(r)))
    if k == 5:
        return [_json_value(r, depth + 1) for _ in range(r.randint(0, 4))]
    return {r.choice(IDENTIFIERS): _json_value(r, depth + 1) for _ in range(r.randint(1, 4))}


def json_text(r: random.Random) -> str:
    kind = r.randrange(4)
    if kind == 0:  # a tool call as the chat template writes it
        call = {"name": r.choice(FUNCTIONS), "arguments": {r.choice(IDENTIFIERS): _json_value(r) for _ in range(r.randint(1, 3))}}
        return json.dumps(call, ensure_ascii=False)
    if kind == 1:  # a tool description, one JSON object per line
        fn = r.choice(FUNCTIONS)
        props = {p: {"type": r.choice(("string", "integer", "number", "boolean")), "description": sentence(r)}
                 for p in r.sample(IDENTIFIERS, r.randint(1, 3))}
        tool = {"type": "function", "function": {"name": fn, "description": sentence(r),
                                                 "parameters": {"type": "object", "properties": props,
                                                                "required": list(props)[:1]}}}
        return json.dumps(tool, ensure_ascii=False)
    if kind == 2:  # a tool result
        return json.dumps({r.choice(IDENTIFIERS): _json_value(r) for _ in range(r.randint(1, 5))},
                          ensure_ascii=r.random() < 0.3)
    return json.dumps(_json_value(r), ensure_ascii=False, indent=r.choice((2, 4)))


def whitespace_text(r: random.Random) -> str:
    lines = []
    for _ in range(r.randint(4, 12)):
        indent = r.choice(("", "  ", "    ", "        ", "\t", "\t\t", "   ", " " * 12))
        word = r.choice((_singular(r.choice(NOUNS)), r.choice(IDENTIFIERS) + ":", "-", "*", number(r), ""))
        trail = r.choice(("", "", " ", "  ", "\t"))
        lines.append(indent + word + trail)
    sep = r.choice(("\n", "\n", "\n\n", "\r\n", "\n\n\n"))
    text = sep.join(lines)
    if r.random() < 0.3:
        text += "\n" * r.randint(2, 6)
    if r.random() < 0.3:
        text = " " * r.randint(1, 20) + text
    return text


def _cjk_run(r: random.Random, alphabet: str, lo: int, hi: int) -> str:
    return "".join(r.choice(alphabet) for _ in range(r.randint(lo, hi)))


def unicode_text(r: random.Random) -> str:
    kind = r.randrange(8)
    if kind == 0:
        return " ".join(r.choice(ACCENTED) for _ in range(r.randint(3, 10))) + "."
    if kind == 1:  # decomposed spellings: base letter + combining marks, next to precomposed ones
        words = ["".join(r.choice(COMBINING) if r.random() < 0.3 else r.choice("aeioulnrst") for _ in range(r.randint(2, 7)))
                 for _ in range(r.randint(3, 8))]
        return " ".join(words) + " " + r.choice(ACCENTED)
    if kind == 2:
        return "。".join(_cjk_run(r, CJK_CHARS, 4, 16) for _ in range(r.randint(1, 4))) + "。"
    if kind == 3:
        return _cjk_run(r, HIRAGANA, 3, 10) + _cjk_run(r, KATAKANA, 2, 6) + _cjk_run(r, CJK_CHARS, 1, 4) + "。"
    if kind == 4:
        return " ".join(r.choice(GREEK + CYRILLIC) for _ in range(r.randint(3, 9))) + "."
    if kind == 5:
        return " ".join(r.choice(ARABIC + HEBREW + DEVANAGARI + HANGUL) for _ in range(r.randint(2, 6)))
    if kind == 6:
        return f"{sentence(r)} {r.choice(EMOJI)}{r.choice(EMOJI) if r.random() < 0.4 else ''}"
    return f"{_singular(r.choice(NOUNS))} {r.choice(SYMBOLS)} {_singular(r.choice(NOUNS))} {r.choice(SYMBOLS)} {number(r)}"


def chat_text(r: random.Random) -> str:
    """Short exchanges in the shapes a chat model sees (without the template's marker tokens)."""
    q = sentence(r) if r.random() < 0.3 else f"{r.choice(QUESTION_WORDS)} {r.choice(('is', 'was'))} {_noun_phrase(r)[0]}?"
    a = paragraph(r)
    if r.random() < 0.3:
        a = f"Let me think. {sentence(r)} So {sentence(r).lower()}\n\n{a}"
    return f"user\n{q}\nassistant\n{a}"


GENERATORS = (
    (prose, 30), (code, 16), (json_text, 14), (numbers_text, 8), (whitespace_text, 8), (unicode_text, 14),
    (chat_text, 10),
)


def documents(seed: int = DEFAULT_SEED, target_bytes: int = DEFAULT_TARGET_BYTES) -> list[str]:
    """The corpus as a list of documents, deterministic in ``seed`` and ``target_bytes``."""
    r = random.Random(seed)
    gens = [g for g, _ in GENERATORS]
    weights = [w for _, w in GENERATORS]
    out: list[str] = []
    size = 0
    # Every fixed non-ASCII list appears at least once, so each of its characters is seen.
    fixed = [" ".join(ACCENTED), " ".join(COMBINING), " ".join(GREEK + CYRILLIC + ARABIC + HEBREW + DEVANAGARI),
             CJK_CHARS, HIRAGANA + KATAKANA, " ".join(HANGUL), " ".join(EMOJI), " ".join(SYMBOLS)]
    for text in fixed:
        out.append(text)
        size += len(text.encode("utf-8"))
    while size < target_bytes:
        text = r.choices(gens, weights)[0](r)
        out.append(text)
        size += len(text.encode("utf-8"))
    return out


def corpus_bytes(seed: int = DEFAULT_SEED, target_bytes: int = DEFAULT_TARGET_BYTES) -> bytes:
    """All documents joined (for hashing and inspection)."""
    return "\n\n".join(documents(seed, target_bytes)).encode("utf-8")
