// render.mjs - renders every case of cases.json with every template listed
// there through @huggingface/jinja and writes goldens.json, the bytes
// tests/test_chat.c expects from kt's native renderers ("templates") and
// tests/test_jinja.c from its interpreter ("templates" and "jinja_templates").
//
// Run by hand (`npm ci && node render.mjs`) when a template or case changes;
// never at build or test time.  It must produce what HF transformers
// (Python jinja2) renders, so it corrects the two places where the JS
// engine differs (numbers in tojson, see README.md) and checks itself where
// it can; it must never be "fixed" to match kt's output.
import { readFileSync, writeFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";

const here = new URL(".", import.meta.url).pathname;

// ---- JSON with number lexemes kept (JS numbers lose 1.0 vs 1 and -0.0) ----

class PyNum {
  constructor(lexeme) {
    this.lexeme = lexeme;
  }
}

function parseJson(text) {
  let i = 0;
  const ws = () => {
    while (/\s/.test(text[i])) i++;
  };
  const value = () => {
    ws();
    const c = text[i];
    if (c === "{") {
      i++;
      const obj = {};
      ws();
      if (text[i] === "}") {
        i++;
        return obj;
      }
      for (;;) {
        ws();
        const key = string();
        if (/^\d+$/.test(key)) throw new Error(`integer-like key ${key} would be reordered by JS`);
        ws();
        if (text[i++] !== ":") throw new Error(`expected : at ${i}`);
        obj[key] = value();
        ws();
        if (text[i] === ",") i++;
        else if (text[i++] === "}") return obj;
        else throw new Error(`expected , or } at ${i}`);
      }
    }
    if (c === "[") {
      i++;
      const arr = [];
      ws();
      if (text[i] === "]") {
        i++;
        return arr;
      }
      for (;;) {
        arr.push(value());
        ws();
        if (text[i] === ",") i++;
        else if (text[i++] === "]") return arr;
        else throw new Error(`expected , or ] at ${i}`);
      }
    }
    if (c === '"') return string();
    for (const [word, v] of [["true", true], ["false", false], ["null", null]]) {
      if (text.startsWith(word, i)) {
        i += word.length;
        return v;
      }
    }
    const m = /^-?\d+(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(i));
    if (!m) throw new Error(`bad JSON at ${i}`);
    i += m[0].length;
    return new PyNum(m[0]);
  };
  const string = () => {
    const m = /^"(?:[^"\\]|\\.)*"/s.exec(text.slice(i));
    if (!m) throw new Error(`bad string at ${i}`);
    i += m[0].length;
    return JSON.parse(m[0]);
  };
  const v = value();
  ws();
  if (i !== text.length) throw new Error(`trailing data at ${i}`);
  return v;
}

// ---- Python's json.dumps(x, ensure_ascii=False) and float repr ----

function pyFloatRepr(x) {
  if (Number.isNaN(x)) return "NaN";
  if (!Number.isFinite(x)) return x < 0 ? "-Infinity" : "Infinity";
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  // Number#toString gives the shortest round-trip digits, closest to x (as repr does).
  let s = x.toString();
  const negative = s.startsWith("-");
  if (negative) s = s.slice(1);
  const [mantissa, expPart] = s.split("e");
  const [intPart, fracPart = ""] = mantissa.split(".");
  let digits = intPart + fracPart;
  let point = intPart.length + (expPart ? parseInt(expPart, 10) : 0);
  while (digits.length > 1 && digits[0] === "0") {
    digits = digits.slice(1);
    point--;
  }
  digits = digits.replace(/0+$/, "") || "0";
  let out;
  if (point <= -4 || point > 16) {
    const exp = point - 1;
    out = digits[0] + (digits.length > 1 ? "." + digits.slice(1) : "") +
      "e" + (exp < 0 ? "-" : "+") + String(Math.abs(exp)).padStart(2, "0");
  } else if (point <= 0) {
    out = "0." + "0".repeat(-point) + digits;
  } else if (point >= digits.length) {
    out = digits + "0".repeat(point - digits.length) + ".0";
  } else {
    out = digits.slice(0, point) + "." + digits.slice(point);
  }
  return (negative ? "-" : "") + out;
}

function pyNumber(n) {
  return /^-?\d+$/.test(n.lexeme) ? BigInt(n.lexeme).toString() : pyFloatRepr(Number(n.lexeme));
}

function pyDumps(v) {
  if (v === null) return "null";
  if (v === true) return "true";
  if (v === false) return "false";
  if (v instanceof PyNum) return pyNumber(v);
  if (typeof v === "string") return JSON.stringify(v); // same escapes as Python's encoder
  if (Array.isArray(v)) return "[" + v.map(pyDumps).join(", ") + "]";
  return "{" + Object.entries(v).map(([k, x]) => JSON.stringify(k) + ": " + pyDumps(x)).join(", ") + "}";
}

// Numbers reach the output only through `tools | tojson`; the JS engine would
// print 1.0 as 1 and 1e-05 as 0.00001, so each becomes a unique string that
// is swapped for Python's spelling after rendering.
function withPlaceholders(v, table) {
  if (v instanceof PyNum) {
    table.push(pyNumber(v));
    return `\u0000N${table.length - 1}\u0000`;
  }
  if (Array.isArray(v)) return v.map((x) => withPlaceholders(x, table));
  if (v && typeof v === "object") {
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, withPlaceholders(x, table)]));
  }
  return v;
}

function replacePlaceholders(text, table) {
  return text.replace(/"\\u0000N(\d+)\\u0000"/g, (_, k) => table[Number(k)]);
}

// ---- kt's input normalisation (chat.h, kt_chat_messages_from_json) ----

function flattenContent(content) {
  if (!Array.isArray(content)) return content;
  return content.map((part) => part.text).join("");
}

function normalise(messages, family, { keepParts = false } = {}) {
  return messages.map((m) => {
    const out = { ...m };
    if (!keepParts) out.content = flattenContent(m.content);
    if (out.reasoning_content == null && out.reasoning != null) out.reasoning_content = out.reasoning;
    delete out.reasoning;
    if (out.reasoning_content == null) delete out.reasoning_content;
    if (!Array.isArray(out.tool_calls) || out.tool_calls.length === 0) {
      delete out.tool_calls;
    } else {
      out.tool_calls = out.tool_calls.map((call) => {
        const args = call.function.arguments;
        return {
          ...call,
          type: "function",
          function: { ...call.function, arguments: typeof args === "string" ? args : pyDumps(args) },
        };
      });
    }
    // DeepSeek's templates concatenate content and would raise on null; "" is
    // what they print for the one branch that tests for none.  kt's interpreter
    // gives every template "" for a null content (chat.h): family "jinja".
    if ((family === "deepseek" || family === "jinja") && out.content == null) out.content = "";
    return out;
  });
}

// ---- render ----

const doc = parseJson(readFileSync(here + "cases.json", "utf8"));
const goldens = {};
let checks = 0;
const kinds = [...doc.templates, ...(doc.jinja_templates ?? [])];
for (const t of kinds) {
  const source = readFileSync(here + t.file, "utf8");
  const template = new Template(source);
  const family = t.family ?? (t.format.startsWith("kimi") ? "kimi" : "deepseek");
  goldens[t.file] = {};
  for (const c of doc.cases) {
    const table = [];
    const context = (messages) => {
      const ctx = {
        messages,
        add_generation_prompt: c.add_generation_prompt,
        bos_token: t.bos_token,
        eos_token: t.eos_token,
      };
      if (c.tools) ctx.tools = withPlaceholders(c.tools, table);
      if (c.thinking !== undefined) ctx.thinking = c.thinking; // chat_template_kwargs
      return ctx;
    };
    const out = replacePlaceholders(template.render(context(normalise(c.messages, family))), table);
    if (out.includes("\u0000")) throw new Error(`${t.file}/${c.name}: placeholder left in output`);
    // Kimi's templates render text parts themselves: flattening must not change a byte.
    const hasParts = c.messages.some((m) => Array.isArray(m.content));
    if (family === "kimi" && hasParts) {
      const native = replacePlaceholders(
        template.render(context(normalise(c.messages, family, { keepParts: true }))), table);
      if (native !== out) throw new Error(`${t.file}/${c.name}: text parts render differently`);
      checks++;
    }
    goldens[t.file][c.name] = out;
  }
}

// Self-check of the Python float spelling against values repr() is known to print.
const known = [[1.0, "1.0"], [1e-5, "1e-05"], [1e-4, "0.0001"], [1e16, "1e+16"],
  [1234567890123456, "1234567890123456.0"], [0.1, "0.1"], [-0, "-0.0"], [2.5e-7, "2.5e-07"],
  [1e22, "1e+22"], [-1.5e300, "-1.5e+300"], [3.141592653589793, "3.141592653589793"], [100, "100.0"]];
for (const [x, want] of known) {
  if (pyFloatRepr(x) !== want) throw new Error(`pyFloatRepr(${x}) = ${pyFloatRepr(x)}, want ${want}`);
  checks++;
}

writeFileSync(here + "goldens.json", JSON.stringify(goldens, null, 1) + "\n");
const n = Object.values(goldens).reduce((s, g) => s + Object.keys(g).length, 0);
console.log(`wrote goldens.json: ${n} renders (${kinds.length} templates x ${doc.cases.length} cases), ${checks} self-checks passed`);
