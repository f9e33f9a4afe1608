#!/usr/bin/env node
// Generates the tokenizer conformance corpus, deterministically (a seeded PRNG; no input):
//   node tests/tokenizer/gen_corpus.js > tests/tokenizer/corpus.jsonl
// One JSON value per line: a string, or {"hex": "..."} for byte strings that are not valid
// UTF-8. The committed corpus.jsonl is this script's output; the test checks that it still is.
//   node tests/tokenizer/gen_corpus.js --bench MB > text   (mixed text for the benchmark)
// Characters are drawn from Unicode 14 or older (Debian 12's PCRE2 tables), so that a
// difference between regex engines' Unicode versions cannot show up as a mismatch.
'use strict';

let seed = 0x5eed41;
function rnd() {  // mulberry32
  seed = (seed + 0x6d2b79f5) >>> 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];
const cp = (lo, hi) => String.fromCodePoint(lo + ri(hi - lo + 1));
const rep = (f, n) => Array.from({ length: n }, f).join('');

const english = [
  'The quick brown fox jumps over the lazy dog.',
  "It's not what you think; we're going to need a bigger boat, aren't we?",
  'In 1969, Apollo 11 landed on the Moon, and Neil Armstrong said: "That\'s one small step for man."',
  'She sells sea shells by the sea shore — or so the old rhyme goes.',
  "They'll arrive at 10:30 a.m. on Tuesday, Dec. 3rd; don't be late!",
  'A tokenizer splits text into pieces that a language model can count, compare and predict.',
  'Mr. and Mrs. Smith paid $1,234.56 (incl. 20% VAT) for the U.S.-made e-bike.',
  'When in the course of human events it becomes necessary for one people to dissolve the political bands...',
  "I've seen things you people wouldn't believe. Attack ships on fire off the shoulder of Orion.",
  'Call me Ishmael. Some years ago — never mind how long precisely — having little or no money in my purse.',
  'The results (see Table 3, p. 42) were significant at p < 0.05, n = 1,024.',
  'Well... I guess so?! Hmm — maybe. OK, fine: yes.',
  "You'd think it'd be easy, but it's surprisingly hard to get every edge case right.",
  'E-mail us at support@example.com or visit https://example.org/path?q=1&r=two#frag.',
  'The mitochondria is the powerhouse of the cell; ATP synthase spins at ~9,000 rpm.',
  "HELLO WORLD! THIS IS ALL CAPS. I'M SHOUTING, AREN'T I?",
  'camelCaseIdentifiers and snake_case_names and kebab-case-words and SCREAMING_SNAKE_CASE.',
  'Rain, rain, go away; come again another day.',
  'To be, or not to be, that is the question: whether \'tis nobler in the mind to suffer.',
  'Her résumé listed naïve café owners in Zürich, São Paulo and Kraków.',
  'The 3rd-quarter revenue grew 12.5% year-over-year to $4.2B, beating estimates of $3.9B.',
  'Footnotes¹ and superscripts² sometimes appear in scientific text³.',
  'He said "yes", she said \'no\', and they both said «peut-être».',
  'Twenty-one thousand, four hundred and six people attended the 2024 final.',
];
const chinese = [
  '我们今天去公园散步，天气非常好。', '机器学习是人工智能的一个分支。', '你好，世界！这是一个测试句子。',
  '北京是中华人民共和国的首都，有三千多年的历史。', '他说：“明天见。”然后就走了。', '请把这份报告在星期五之前发给我。',
  '深度求索发布了新的语言模型，参数量达到数千亿。', '春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。',
  '这个价格是１２３元，比去年贵了百分之十五。', '数据结构和算法是计算机科学的基础课程。',
];
const japanese = [
  '今日はいい天気ですね。', '私は東京に住んでいます。', 'カタカナとひらがなと漢字を混ぜて書きます。',
  'コンピューターのプログラムを書くのが好きです。', '吾輩は猫である。名前はまだ無い。', 'ありがとうございました！またね〜',
  'ｶﾀｶﾅの半角文字も使われることがあります。', '新幹線で大阪まで２時間半かかります。',
];
const korean = [
  '안녕하세요, 만나서 반갑습니다.', '한국어는 한글로 씁니다.', '오늘 저녁에 뭐 먹을까요?',
  '서울은 대한민국의 수도입니다.', '기계 학습 모델을 훈련시키는 데 시간이 오래 걸립니다.',
];
const otherScripts = [
  'مرحبا بالعالم! هذه جملة اختبار باللغة العربية.', 'اللغة العربية جميلة جداً، ٣٤٥ كتاباً في المكتبة.',
  'नमस्ते दुनिया! यह एक परीक्षण वाक्य है।', 'हिन्दी भाषा देवनागरी लिपि में लिखी जाती है। २०२४',
  'Привет, мир! Это тестовое предложение.', 'Съешь же ещё этих мягких французских булок, да выпей чаю.',
  'Γειά σου Κόσμε! Αυτή είναι μια δοκιμαστική πρόταση. ΟΔΟΣ ΣΟΦΟΣ.', 'שלום עולם! זה משפט בדיקה.',
  'สวัสดีชาวโลก นี่คือประโยคทดสอบ', 'Xin chào thế giới! Đây là một câu thử nghiệm tiếng Việt.',
  'İstanbul’da ılık bir gün; IŞIK ışık.', 'Grüße aus Köln: Straße, Maß, Fuß.', 'ქართული ენა ძალიან ლამაზია.',
  'Բարեւ աշխարհ', 'ሰላም ለዓለም', 'வணக்கம் உலகம்', 'ভাষা বাংলা লিপিতে লেখা হয়।', 'ਸਤ ਸ੍ਰੀ ਅਕਾਲ ਦੁਨੀਆ',
];
const emoji = [
  '😀', '😂', '🤖', '🚀', '❤️', '👍🏽', '👋🏿', '🙏🏻', '👨‍👩‍👧‍👦', '👩‍💻', '👩🏽‍💻', '🏳️‍🌈', '🏴‍☠️', '❤️‍🔥',
  '🧑‍🤝‍🧑', '👁️‍🗨️', '🇺🇸', '🇯🇵', '🇨🇳', '🇰🇷', '🇩🇪', '🇫🇷', '🇪🇺', '1️⃣', '#️⃣', '©️', '™️', '☕', '⚡', '🎉🎊', '🔥🔥🔥',
  '🫠', '🫶🏾', '🥲', '🧠', '🦀', '🐍', '🏴󠁧󠁢󠁳󠁣󠁴󠁿',
];
const code = [
  '#include <stdio.h>\n\nint main(int argc, char **argv) {\n    printf("hello, %s\\n", argv[0]);\n    return 0;\n}\n',
  'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n',
  'const sum = (xs) => xs.reduce((a, b) => a + b, 0);\nconsole.log(`total: ${sum([1, 2, 3])}`);\n',
  'fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!("{:?}", v);\n}\n',
  'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("hi")\n\tfor i := 0; i < 3; i++ {\n\t\tfmt.Printf("%d\\n", i)\n\t}\n}\n',
  'public class Hello {\n    public static void main(String[] args) {\n        System.out.println("Hello, World!");\n    }\n}\n',
  'SELECT u.id, u.name, COUNT(o.id) AS n_orders\nFROM users u LEFT JOIN orders o ON o.user_id = u.id\nWHERE u.created_at >= \'2024-01-01\'\nGROUP BY u.id HAVING n_orders > 5;\n',
  '<!DOCTYPE html>\n<html lang="en">\n<head><meta charset="utf-8"><title>Test</title></head>\n<body><p class="x">Hi &amp; bye</p></body>\n</html>\n',
  '#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l "$f" | awk \'{print $1}\'\ndone 2>/dev/null || echo "none"\n',
  '{"name": "ds41", "version": "0.1.0", "deps": {"jansson": ">=2.14"}, "list": [1, 2.5, -3e10, true, null]}\n',
  'template <typename T>\nstd::vector<T> twice(const std::vector<T>& v) {\n  std::vector<T> out; out.reserve(2*v.size());\n  for (auto& x : v) { out.push_back(x); out.push_back(x); }\n  return out;\n}\n',
  'x = np.linspace(0, 2*np.pi, 100)\ny = np.sin(x) ** 2 + np.cos(x) ** 2  # == 1.0\nassert np.allclose(y, 1.0), "math is broken"\n',
  '    if (err != nil) {\r\n        return -1;\r\n    }\r\n',
  'main :: IO ()\nmain = mapM_ print [x * y | x <- [1..3], y <- [x..3]]\n',
  '(defun fact (n) (if (<= n 1) 1 (* n (fact (- n 1)))))\n',
  '\\begin{equation}\n  E = mc^2 \\quad \\text{and} \\quad \\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}\n\\end{equation}\n',
  'a += 1; b -= 2; c *= 3; d /= 4; e %= 5; f <<= 6; g >>= 7; h &&= i || j ?? k;\n',
  '// TODO(user): fix this!!!\n/* multi\n   line */ int x = 0x7fFF_ffFF; float y = 1.5e-3f;\n',
];
const specials = [
  '<｜begin▁of▁sentence｜>', '<｜end▁of▁sentence｜>', '<｜▁pad▁｜>', '<｜User｜>', '<｜Assistant｜>', '<|EOT|>',
  '<｜fim▁hole｜>', '<｜fim▁begin｜>', '<｜fim▁end｜>', '<｜tool▁calls▁begin｜>', '<｜tool▁calls▁end｜>',
  '<｜tool▁call▁begin｜>', '<｜tool▁call▁end｜>', '<｜tool▁outputs▁begin｜>', '<｜tool▁outputs▁end｜>',
  '<｜tool▁output▁begin｜>', '<｜tool▁output▁end｜>', '<｜tool▁sep｜>', '<｜place▁holder▁no▁0｜>',
  '<｜place▁holder▁no▁17｜>', '<｜place▁holder▁no▁796｜>', '<think>', '</think>',
];
const specialsPartial = ['<｜User', 'User｜>', '<｜', '｜>', '<|EOT|', '<｜begin▁of▁sentence', '▁', '｜', '<｜user｜>', '< ｜User｜>'];
const wsAtoms = [' ', '  ', '\t', '\n', '\r\n', '\r', '\n\n', '\u00a0', '\u3000', '\u2028', '\u2029', '\u0085', '\u180e',
  '\u200b', '\u2009', '\u202f', '\u205f', '\u000b', '\u000c', '\ufeff'];
const punct = '!"#$%&\'()*+,-./:;<=>?@[\\]^_`{|}~';
// Assigned ranges (Unicode <= 14) for random characters.
const blocks = [
  [0x20, 0x7e], [0xa1, 0xff], [0x100, 0x17f], [0x180, 0x24f], [0x250, 0x2af], [0x300, 0x36f], [0x391, 0x3c9],
  [0x400, 0x4ff], [0x531, 0x556], [0x5d0, 0x5ea], [0x621, 0x64a], [0x660, 0x669], [0x905, 0x939], [0x93e, 0x94d],
  [0x966, 0x96f], [0x985, 0x9b9], [0xe01, 0xe3a], [0x10d0, 0x10fa], [0x1100, 0x1112], [0x1e00, 0x1eff],
  [0x2010, 0x2027], [0x2030, 0x205e], [0x2070, 0x2079], [0x20a0, 0x20bf], [0x2100, 0x214f], [0x2150, 0x2188],
  [0x2190, 0x21ff], [0x2200, 0x22ff], [0x2460, 0x24ff], [0x2500, 0x257f], [0x25a0, 0x25ff], [0x2600, 0x26ff],
  [0x3001, 0x303f], [0x3041, 0x3096], [0x30a1, 0x30fa], [0x3105, 0x312f], [0x3400, 0x4dbf], [0x4e00, 0x9fa5],
  [0x9fa6, 0x9ffc], [0xac00, 0xd7a3], [0xf900, 0xfa6d], [0xfe30, 0xfe4f], [0xff01, 0xff5e], [0xff61, 0xff9f],
  [0x1d400, 0x1d4ff], [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f], [0x1f680, 0x1f6c5], [0x1f900, 0x1f9ff],
  [0x20000, 0x2a6df],
];
const randChar = () => { const b = pick(blocks); return cp(b[0], b[1]); };
const digitsets = [[0x30, 0x39], [0x660, 0x669], [0x966, 0x96f], [0xff10, 0xff19], [0x6f0, 0x6f9], [0xe50, 0xe59]];

function number(len) {
  let s = String(1 + ri(9));
  for (let i = 1; i < len; i++) s += String(ri(10));
  return s;
}
function grouped(len) {
  const s = number(len);
  return s.replace(/\B(?=(\d{3})+(?!\d))/g, pick([',', '.', ' ', '\u202f', '_', "'"]));
}

const out = [];
const add = (s) => out.push(s);

function corpus() {
  // English prose: sentences, paragraphs, case variants
  for (const s of english) { add(s); add(s.toUpperCase()); add(s.toLowerCase()); add(' ' + s); add(s + '\n'); }
  for (let i = 0; i < 500; i++) {
    const n = 1 + ri(6);
    add(rep(() => pick(english), n).replace(/\. /g, pick(['. ', '.\n', '.  ', '.\n\n', '. '])));
  }
  // code
  for (const c of code) { add(c); add(c.replace(/    /g, '\t')); add(c.replace(/\n/g, '\r\n')); }
  for (let i = 0; i < 400; i++) {
    const c = pick(code), lines = c.split('\n');
    const a = ri(lines.length), b = a + 1 + ri(lines.length - a);
    add(lines.slice(a, b).join('\n').replace(/^/gm, () => pick(['', '  ', '    ', '\t', '\t\t', '        '])));
  }
  // CJK and other scripts
  for (const s of [...chinese, ...japanese, ...korean, ...otherScripts]) { add(s); add(' ' + s + ' '); }
  for (let i = 0; i < 700; i++) {
    const bank = pick([chinese, japanese, korean, otherScripts, otherScripts]);
    add(rep(() => pick(bank), 1 + ri(4)));
  }
  for (let i = 0; i < 300; i++) add(rep(() => pick([cp(0x4e00, 0x9fa5), cp(0x3041, 0x3096), cp(0x30a1, 0x30fa), cp(0xac00, 0xd7a3), cp(0x3400, 0x4dbf), cp(0x9fa6, 0x9ffc), cp(0x20000, 0x2a6df), pick(['，', '。', '、', '「', '」', '！', '？', ' '])]), 1 + ri(40)));
  // emoji
  for (const e of emoji) { add(e); add('a' + e + 'b'); add(e + e); add(' ' + e); }
  for (let i = 0; i < 300; i++) add(rep(() => pick([pick(emoji), pick(emoji), ' ', pick(english).slice(0, ri(20)), '\u200d', '\ufe0f']), 1 + ri(8)));
  // numbers of every length, grouped, decimals, other digit sets
  for (let len = 1; len <= 64; len++) { add(number(len)); add(' ' + number(len)); add('x' + number(len) + 'y'); add(grouped(len)); }
  for (let i = 0; i < 300; i++) {
    add(pick([
      () => number(1 + ri(12)) + '.' + number(1 + ri(8)),
      () => '-' + number(1 + ri(6)) + 'e' + pick(['+', '-', '']) + number(1 + ri(3)),
      () => '+1 (' + number(3) + ') ' + number(3) + '-' + number(4),
      () => '$' + grouped(1 + ri(10)) + '.' + number(2),
      () => rep(() => { const d = pick(digitsets); return cp(d[0], d[1]); }, 1 + ri(10)),
      () => number(1 + ri(30)) + pick(['%', 'km', ' kg', '°C', 'th', 'px', '²', '½']),
      () => '0x' + rep(() => pick('0123456789abcdefABCDEF'), 1 + ri(16)),
      () => rep(() => number(1 + ri(5)), 2 + ri(5)).split('').join(pick(['', ' ', ',', '.'])),
      () => pick(['Ⅻ', 'ⅷ', '①②③', '⁴⁵⁶', '¼', '٣٤٥', '१२३']) + number(1 + ri(4)),
    ])());
  }
  // runs of whitespace
  for (let n = 1; n <= 40; n++) {
    for (const w of [' ', '\t', '\n']) { add(w.repeat(n)); add('a' + w.repeat(n) + 'b'); add(w.repeat(n) + 'x'); add('x' + w.repeat(n)); }
    add('\r\n'.repeat(n));
  }
  for (let i = 0; i < 400; i++) add(rep(() => pick([pick(wsAtoms), pick(wsAtoms), 'word', 'x', '.', '!', '1', '中', "'s", 'é']), 1 + ri(12)));
  // special-token strings inside user text
  for (const s of [...specials, ...specialsPartial]) { add(s); add('text' + s + 'more'); add(' ' + s + ' '); add(s + s); add('\n' + s + '\n'); }
  for (let i = 0; i < 400; i++) {
    add(rep(() => pick([pick(specials), pick(specials), pick(specialsPartial), pick(english), ' ', '\n', pick(chinese), number(1 + ri(5))]), 1 + ri(6)));
  }
  // random characters and ASCII soups (regex edge cases)
  for (let i = 0; i < 500; i++) add(rep(randChar, 1 + ri(30)));
  for (let i = 0; i < 400; i++) {
    add(rep(() => pick([pick(punct), pick(punct), cp(0x61, 0x7a), cp(0x41, 0x5a), cp(0x30, 0x39), ' ', '\n', '\t', "'", "'s", "'LL", "'re", "n't"]), 1 + ri(25)));
  }
  // mixed scripts without spaces
  for (let i = 0; i < 400; i++) {
    add(rep(() => pick([pick(english).split(' ')[0], pick(chinese).slice(0, 3), pick(japanese).slice(0, 3), pick(korean).slice(0, 3),
      pick(otherScripts).slice(0, 4), pick(emoji), number(1 + ri(4)), pick(punct), '\u0301', '\u200d']), 2 + ri(10)));
  }
  // controls and NUL
  for (let c = 0; c < 32; c++) { add(String.fromCharCode(c)); add('a' + String.fromCharCode(c) + 'b'); }
  add('\u0000\u0000\u0000'); add('nul\u0000in\u0000the middle'); add('\u007f\u0080\u009f');
  // long inputs: 100 KB single words, a long mixed line
  add(rep(() => cp(0x61, 0x7a), 100000));
  add('a'.repeat(100000));
  add(rep(() => cp(0x4e00, 0x9fa5), 34000));
  add('9'.repeat(100000));
  add(' '.repeat(50000) + 'x');
  add(rep(() => pick(english) + ' ', 400));
  // empty
  add('');
}

function invalidUtf8() {
  const hex = [
    'ff', 'fe', 'c0', 'c1', 'f5', 'f8', '80', 'bf', '8080', 'c080', 'e08080', 'f0808080', 'eda080', 'edbfbf',
    'f4908080', 'c2', 'e4b8', 'f09f98', 'e4b841', '41e4', '41f09f98', 'c3a9c3', 'e4b8ade6', 'f09f', 'f09f9880',
    'ed9fbf', 'efbfbd', '61ff62', 'ffff', 'c0af', 'e0a0', 'e09f80', 'f48f', 'f48fbfbf', 'f4908f', 'f0', 'e1',
    '3cefbd9c55736572efbd9cff', // special token text followed by a bad byte
  ];
  for (const h of hex) add({ hex: h });
  for (let i = 0; i < 60; i++) {
    const bytes = Buffer.from(pick(english).slice(0, 5 + ri(30)) + pick(chinese).slice(0, 1 + ri(5)), 'utf8');
    const k = ri(bytes.length);
    const arr = [...bytes];
    arr.splice(k, pick([0, 1]), pick([0xff, 0x80, 0xc3, 0xe4, 0xf0, 0xed, 0xc0]));
    if (ri(2)) arr.splice(ri(arr.length), 1);  // may cut a character in half
    add({ hex: Buffer.from(arr).toString('hex') });
  }
}

function benchText(mb) {
  // paragraphs of every kind, each up to a few KB, until mb MB
  const parts = [];
  let size = 0;
  const gens = [
    () => rep(() => pick(english), 3 + ri(10)) + '\n\n',
    () => pick(code).replace(/^/gm, () => pick(['', '    ', '\t'])) + '\n',
    () => rep(() => pick(chinese), 2 + ri(5)) + '\n',
    () => rep(() => pick(japanese), 2 + ri(5)) + '\n',
    () => rep(() => pick(korean), 2 + ri(4)) + '\n',
    () => rep(() => pick(otherScripts), 2 + ri(4)) + '\n',
    () => rep(() => grouped(1 + ri(12)) + ' ', 5 + ri(20)) + '\n',
    () => rep(() => pick(emoji) + ' ' + pick(english).slice(0, 20), 2 + ri(5)) + '\n',
  ];
  const weights = [10, 5, 2, 1, 1, 1, 1, 1];
  const table = weights.flatMap((w, i) => Array(w).fill(i));
  while (size < mb * 1024 * 1024) {
    const p = gens[pick(table)]();
    parts.push(p);
    size += Buffer.byteLength(p);
  }
  return parts.join('');
}

const args = process.argv.slice(2);
if (args[0] === '--bench') {
  process.stdout.write(benchText(Number(args[1] || 10)));
} else {
  corpus();
  invalidUtf8();
  process.stdout.write(out.map((s) => JSON.stringify(s)).join('\n') + '\n');
}
