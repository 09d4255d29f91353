#!/usr/bin/env python3
"""Writes tests/tokenizer/data/corpus.json: the tokenizer tests' inputs.

Deterministic (seeded; Python 3.11's Unicode 14 database decides which code
points are assigned, so every engine in the tests - RE2, ICU, V8 - knows them
all). Re-run after editing and commit the result:

    tests/tokenizer/tools/make_corpus.py > tests/tokenizer/data/corpus.json

"texts" are encoded and decoded by every tokenizer; "byte_sequences" are raw
byte strings (mostly not UTF-8) that the decode tests write as byte tokens.
"""
import json
import random
import sys
import unicodedata

rng = random.Random(20240607)

WORDS = """the of and to in is was for on that with as by at from his her they we you it this
be are have had not but what all were when there can an your which their said if do will each
about how up out them then she many some so these would other into has more two like him time see
no could make than first been its who now people my made over did down only way find use may
water long little very after words called just where most know get through back much before go
good new write our used me man too any day same right look think also around another came come
work three word must because does part even place well such here take why things help put years
different away again off went old number great tell men say small every found still between name
should home big give air line set own under read last never us left end along while might next
sound below saw something thought both few those always looked show large often together asked
house world going want school important until form food keep children feet land side without boy
once animals life enough took sometimes four head above kind began almost live page got earth
need far hand high year mother light parts country father let night following picture being study
second eyes soon times story boys since white days ever paper hard near sentence better best across
during today others however sure means knew it's try told young miles sun ways thing whole hear
example heard several change answer room sea against top turned learn point city play toward five
using himself usually""".split()

CJK = [
    "日本語のテキスト", "東京は日本の首都です。", "私はコーヒーが好きです", "ひらがなとカタカナ",
    "カタカナ・テスト", "漢字かな交じり文", "今日は良い天気ですね！", "吾輩は猫である。名前はまだ無い。",
    "中文测试", "我爱北京天安门", "人工智能正在改变世界。", "这是一个句子，包含标点符号。",
    "繁體中文與简体中文", "机器学习和深度学习", "你好，世界！", "春眠不觉晓，处处闻啼鸟。",
    "한국어 텍스트", "안녕하세요 세계", "대한민국의 수도는 서울입니다.", "한글과 漢字 혼용",
    "ｆｕｌｌｗｉｄｔｈ　ｓｐａｃｅ", "半角ｶﾀｶﾅ", "全角数字１２３４５", "「引用」と『二重引用』",
    "〜ですか？", "テスト　全角スペース", "𠮷野家", "𩸽と𠀋", "龘靐齉爩", "丂丄丅丆",
]

EMOJI = [
    "🙂", "🚀", "👍🏽", "👨‍👩‍👧‍👦", "👩🏻‍💻", "🏳️‍🌈", "🇯🇵🇺🇸🇩🇪", "1️⃣2️⃣#️⃣", "❤️", "🧑‍🤝‍🧑",
    "😀😃😄😁", "🤖 robots", "🎉🎊", "👁‍🗨", "🐕‍🦺", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "☕️", "✌🏿", "🤷‍♀️", "🫶",
    "😂😂😂", "🍣🍜🍱", "⚽️🏀", "🌍🌎🌏", "👩‍❤️‍💋‍👨", "🧔🏾‍♂️", "🏃🏽‍♀️‍➡️", "©️®️™️", "🔥💯",
]

COMBINING = [
    "e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "Ame\u0301lie", "cafe\u0301", "nai\u0308ve",
    "Z\u0351\u036b\u0343a\u0360l\u0352g\u0310o", "\u0915\u094d\u0937", "\u0928\u092e\u0938\u094d\u0924\u0947",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35", "\u0645\u064e\u0631\u0652\u062d\u064e\u0628\u064b\u0627",
    "\u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd", "\u1100\u1161\u11a8", "\u1112\u1161\u11ab\u1100\u1173\u11af",
    "A\u030a", "\u212b", "\u00c5", "\u1e9b\u0323", "q\u0307\u0323", "\u0041\u0300\u0301\u0302",
    "\u03b1\u0301\u0345", "\u1f00\u0345", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "\u0e40\u0e01\u0e37\u0e2d\u0e1a", "\u0f40\u0f7a\u0f72", "\ufb01 ligature", "x\u20dd", "1\u20e3",
]

SCRIPTS = [
    "Привет, мир! Как дела?", "Съешь же ещё этих мягких французских булок.", "Ελληνικά: γειά σου κόσμε",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
    "हिन्दी में लिखा गया वाक्य।", "สวัสดีชาวโลก", "გამარჯობა", "Բարեւ աշխարհ", "ሰላም ልዑል",
    "Xin chào thế giới", "Tiếng Việt có dấu", "Zażółć gęślą jaźń", "Příliš žluťoučký kůň",
    "Árvíztűrő tükörfúrógép", "Dès Noël où un zéphyr haï", "Größe, Maß, Straße", "ĳ Ĳ ŉ ſ",
    "İstanbul ıı İİ", "Çağrı Öztürk", "Ærøskøbing", "Þórr and Óðinn", "ǅemal ǈudevit",
    "বাংলা ভাষা", "தமிழ் மொழி", "తెలుగు", "ಕನ್ನಡ", "മലയാളം", "ગુજરાતી", "ਪੰਜਾਬੀ", "සිංහල",
    "ພາສາລາວ", "ភាសាខ្មែរ", "မြန်မာဘာသာ", "ᠮᠣᠩᠭᠣᠯ", "ꦧꦱꦗꦮ", "ᏣᎳᎩ", "ᐃᓄᒃᑎᑐᑦ",
]

CODE = [
    "def f(x):\n    return x * 2",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "#include <stdio.h>\nint main(void) { printf(\"hi\\n\"); return 0; }",
    "const add = (a, b) => a + b;\nconsole.log(add(1, 2));",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
    "<div class=\"x\"><p>Hello &amp; welcome</p></div>",
    "$ ls -la | grep '^d' && echo \"done\" >> /tmp/log.txt",
    "if __name__ == '__main__':\n    main()\n",
    "fn main() {\n    let v: Vec<i32> = (0..10).collect();\n}",
    "x = [i**2 for i in range(10) if i % 2 == 0]",
    "a<<=2; b>>=1; c!==d; e===f; g&&h||i",
    "```python\nprint('hi')\n```",
    "// TODO(fix): handle\r\n// CRLF line endings\r\n",
    "   indented\n\t\ttabbed\n  \t mixed",
    "@decorator\nclass Foo(Bar, metaclass=Meta):\n    pass",
    "std::vector<std::pair<int,std::string>> v{{1,\"a\"}};",
    "git commit -m \"fix: don't crash on empty input\"",
    "SELECT * FROM t WHERE s LIKE '%it''s%';",
    "matrix[i][j] += alpha * (b[k] - c[k]) / 3.0e-5;",
]

SPECIAL_LOOKALIKES = [
    "<s>", "</s>", "<unk>", "<pad>", "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
    "<|end_of_text|>", "<|endoftext|>", "<|start_header_id|>user<|end_header_id|>", "[INST]", "[/INST]",
    "<<SYS>>", "<</SYS>>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<|eot_id", "<|im_start|",
    "<s >", "< s>", "<<s>>", "<|<|eot_id|>|>", "<|EOT_ID|>", "<|fim_prefix|>", "<tool_call>",
    "<|reserved_special_token_0|>", "<|python_tag|>", "<0x41>", "<0xZZ>", "▁", "▁▁Hello", "Ġhello",
    "Ċ", "ĉ", "<|im_start|>system\nYou are helpful.<|im_end|>", "text<s>more</s>end",
    "<s><s><s>", "</s></s>", "a<|eot_id|>b<|eot_id|>c", "<|im_end|><|im_start|>",
]


def word_sentence():
    n = rng.randint(1, 14)
    words = [rng.choice(WORDS) for _ in range(n)]
    if rng.random() < 0.5:
        words[0] = words[0].capitalize()
    s = " ".join(words)
    return s + rng.choice(["", ".", "!", "?", ",", "...", ";", ":"])


def whitespace_text():
    pieces = []
    for _ in range(rng.randint(1, 6)):
        ws = "".join(rng.choice([" ", " ", " ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2003",
                                 "\u0085", "\u2028", "\u000b", "\u000c", "\u200b", "\u202f"])
                     for _ in range(rng.randint(1, 8)))
        pieces.append(ws)
        if rng.random() < 0.8:
            pieces.append(rng.choice(WORDS + ["x", "1", ".", "日本", "🙂"]))
    return "".join(pieces)


def number_text():
    kind = rng.randint(0, 7)
    if kind == 0:
        return str(rng.randint(0, 10 ** rng.randint(1, 40)))
    if kind == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 9)}f}"
    if kind == 2:
        return f"{rng.random():e}"
    if kind == 3:
        return " ".join(str(rng.randint(0, 9999)) for _ in range(rng.randint(2, 8)))
    if kind == 4:
        return f"{rng.randint(1, 12)}/{rng.randint(1, 28)}/{rng.randint(1900, 2100)}"
    if kind == 5:
        return f"+1 ({rng.randint(100, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}"
    if kind == 6:
        return "".join(rng.choice("0123456789,._ ") for _ in range(rng.randint(3, 30)))
    return rng.choice(["١٢٣٤٥", "१२३४५", "๑๒๓", "Ⅻ ⅻ", "½ ¾ ⅞", "²³¹", "①②③", "𝟙𝟚𝟛", "１２３"])


# Assigned code points (Unicode 14) from blocks every engine here knows.
BLOCKS = [(0x20, 0x7E), (0xA1, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x530, 0x58F),
          (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x10A0, 0x10FF),
          (0x1100, 0x11FF), (0x2000, 0x206F), (0x2190, 0x21FF), (0x2200, 0x22FF), (0x2500, 0x257F),
          (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xFF00, 0xFFEF),
          (0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F680, 0x1F6FF), (0x20000, 0x2A6DF)]


def random_unicode():
    out = []
    for _ in range(rng.randint(1, 24)):
        lo, hi = rng.choice(BLOCKS)
        while True:
            cp = rng.randint(lo, hi)
            if unicodedata.category(chr(cp)) not in ("Cn", "Cs", "Co"):
                break
        out.append(chr(cp))
        if rng.random() < 0.2:
            out.append(" ")
    return "".join(out)


def mixed():
    parts = [rng.choice(WORDS), rng.choice(CJK), rng.choice(EMOJI), rng.choice(SCRIPTS),
             number_text(), rng.choice(SPECIAL_LOOKALIKES), rng.choice(COMBINING)]
    rng.shuffle(parts)
    return rng.choice([" ", "", "\n", "  "]).join(parts[: rng.randint(2, 5)])


def contraction():
    base = rng.choice(["I'm", "you're", "we've", "they'll", "he'd", "it's", "can't", "won't",
                       "I'M", "YOU'RE", "It'S", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d",
                       "rock 'n' roll", "''quoted''", "l'amour", "O'Neil's", "‘curly’ it’s"])
    return base if rng.random() < 0.5 else f"{word_sentence()} {base} {rng.choice(WORDS)}"


def punctuation():
    return rng.choice([
        "Hello, world!", "Wait... what?!", "(parenthetical) [bracket] {brace}", "a -- b — c – d",
        "\"double\" 'single' «guillemets» „low“", "https://example.com/path?q=1&r=two#frag",
        "user.name+tag@example.co.uk", "**bold** _italic_ `code` ~~strike~~", "# Heading\n- item\n- item",
        "1. first\n2. second", "| a | b |\n|---|---|", "C:\\Windows\\System32", "~/.config/app.toml",
        "!!!???...,,,;;;", "#hashtag @mention $100 50% ^caret &amp;", "=>->:::<=>", "a.b.c.d.e",
        "Mr. Smith & Co., Inc.", "e.g., i.e., etc.", "He said: \"It's fine.\"",
    ])


def long_text():
    return " ".join(word_sentence() for _ in range(rng.randint(60, 160)))


def texts():
    out = ["", " ", "  ", "\n", "\t", "a", "A", ".", "Hello", " Hello", "Hello ", "hello world",
           "Once upon a time", "The quick brown fox jumps over the lazy dog.",
           "  leading spaces and\ttabs\nnewline", "1234567890 + 0987654321 = ?",
           "<s> not a special token </s>", "emoji 🙂🚀 test", "Héllo wörld, café"]
    out += CJK + EMOJI + COMBINING + SCRIPTS + CODE + SPECIAL_LOOKALIKES
    generators = [(word_sentence, 380), (whitespace_text, 230), (number_text, 170),
                  (random_unicode, 330), (mixed, 330), (contraction, 80), (punctuation, 60),
                  (lambda: rng.choice(CJK) + rng.choice(["", " ", "。"]) + rng.choice(CJK), 80),
                  (lambda: "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 6))), 80),
                  (lambda: rng.choice(WORDS) + rng.choice(COMBINING) + rng.choice(WORDS), 60),
                  (lambda: rng.choice(CODE) + "\n" + rng.choice(CODE), 40),
                  (lambda: rng.choice(SPECIAL_LOOKALIKES) + rng.choice(["", " ", "\n"]) +
                   word_sentence() + rng.choice(SPECIAL_LOOKALIKES), 80),
                  (long_text, 12)]
    for gen, count in generators:
        out += [gen() for _ in range(count)]
    return out


def byte_sequences():
    """Byte strings for the decode direction: ill-formed UTF-8 and characters
    split across tokens."""
    fixed = [
        [0xE6], [0xE6, 0x97], [0xE6, 0x97, 0xA5], [0xE6, 0x41], [0xE6, 0x97, 0x41], [0x97],
        [0x97, 0xA5], [0xC3], [0xC3, 0xA9], [0xC3, 0xC3, 0xA9], [0xC0, 0x80], [0xC1, 0xBF],
        [0xE0, 0x80, 0x80], [0xE0, 0x9F, 0xBF], [0xED, 0xA0, 0x80], [0xED, 0xBF, 0xBF],
        [0xF0, 0x9F, 0x98, 0x80], [0xF0, 0x9F, 0x98], [0xF0, 0x9F], [0xF0], [0xF0, 0x80, 0x80, 0x80],
        [0xF4, 0x90, 0x80, 0x80], [0xF5, 0x80, 0x80, 0x80], [0xFE], [0xFF], [0xFF, 0xFE],
        [0xEF, 0xBB, 0xBF, 0x41], [0x41, 0xEF, 0xBB, 0xBF], [0xE2, 0x82, 0xAC, 0xE2, 0x82],
        [0xF0, 0x9F, 0x91, 0xA8, 0xE2, 0x80, 0x8D, 0xF0, 0x9F, 0x91, 0xA9],
        [0x80, 0x80, 0x80, 0x80, 0x80], [0xE6, 0xE6, 0xE6], [0x0A, 0xE6, 0x0A], [0x20, 0xE6, 0x20],
    ]
    rand = []
    for _ in range(90):
        n = rng.randint(1, 10)
        rand.append([rng.choice([rng.randint(0x80, 0xFF), rng.randint(0, 0x7F), 0xE6, 0x97, 0xF0,
                                 0x9F, 0xC3]) for _ in range(n)])
    return fixed + rand


def main():
    corpus = {"texts": texts(), "byte_sequences": byte_sequences()}
    json.dump(corpus, sys.stdout, ensure_ascii=False, indent=0)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
