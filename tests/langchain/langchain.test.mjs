// langchain.test.mjs - drives a running kt-serve through LangChain's
// ChatOpenAI (npm @langchain/openai + @langchain/core, pinned in
// package-lock.json): withStructuredOutput by its two methods, json_schema
// (response_format, strict) and function calling (a named tool_choice), on a
// random synthetic model, where only kt's constrained decoding makes the
// output parse.  Every result is validated against its schema here.
//
//   node langchain.test.mjs BASE_URL MODEL     (BASE_URL like http://127.0.0.1:8080/v1)
//
// Exits 0 when every check passed; prints the failure and exits 1 otherwise.
import assert from "node:assert/strict";
import { ChatOpenAI } from "@langchain/openai";

const [baseURL, model] = process.argv.slice(2);

const sent = [];  // the request bodies LangChain sent
const llm = new ChatOpenAI({
  model, apiKey: "unused", temperature: 1, maxTokens: 600, maxRetries: 0,
  // a random model rarely closes a string or an object by chance: favour '"', ']' and '}' (kt-synth's byte tokens)
  modelKwargs: { logit_bias: { 34: 4, 93: 4, 125: 4 }, seed: 5 },
  configuration: {
    baseURL,
    fetch: async (url, init) => {
      if (init?.body) sent.push(JSON.parse(init.body));
      return fetch(url, init);
    },
  },
});

const trip = {
  title: "trip",
  description: "A planned trip",
  type: "object",
  properties: {
    city: { type: "string", maxLength: 12 },
    days: { type: "integer" },
    units: { type: "string", enum: ["metric", "imperial"] },
    tags: { type: "array", items: { type: "string", maxLength: 6 }, maxItems: 3 },
    budget: { anyOf: [{ type: "number" }, { type: "null" }] },
  },
  required: ["city", "days", "units", "tags", "budget"],
  additionalProperties: false,
};

// The schema's checks, written out (no validator package: what the grammar promises, checked independently).
function checkTrip(t) {
  assert.equal(typeof t, "object");
  assert.ok(t !== null && !Array.isArray(t));
  assert.deepEqual(Object.keys(t).sort(), ["budget", "city", "days", "tags", "units"]);
  assert.ok(typeof t.city === "string" && [...t.city].length <= 12, `city ${JSON.stringify(t.city)}`);
  assert.ok(Number.isInteger(t.days), `days ${t.days}`);
  assert.ok(["metric", "imperial"].includes(t.units), `units ${t.units}`);
  assert.ok(Array.isArray(t.tags) && t.tags.length <= 3, `tags ${JSON.stringify(t.tags)}`);
  for (const tag of t.tags) assert.ok(typeof tag === "string" && [...tag].length <= 6, `tag ${JSON.stringify(tag)}`);
  assert.ok(t.budget === null || typeof t.budget === "number", `budget ${t.budget}`);
}

const cases = {
  async jsonSchemaMethod() {
    sent.length = 0;
    const structured = llm.withStructuredOutput(trip, { method: "jsonSchema", strict: true, includeRaw: true });
    const r = await structured.invoke("Plan a trip to Paris.");
    assert.equal(sent.length, 1);
    assert.equal(sent[0].response_format?.type, "json_schema", JSON.stringify(sent[0].response_format));
    assert.equal(sent[0].response_format.json_schema.strict, true);
    assert.equal(r.parsingError, undefined, String(r.parsingError));
    checkTrip(r.parsed);
    assert.deepEqual(JSON.parse(r.raw.content), r.parsed);
    assert.equal(r.raw.response_metadata.finish_reason, "stop");
  },

  async functionCallingMethod() {
    sent.length = 0;
    const structured = llm.withStructuredOutput(trip, { method: "functionCalling", includeRaw: true });
    const r = await structured.invoke("Plan a trip to Rome.");
    assert.equal(sent.length, 1);
    assert.deepEqual(sent[0].tool_choice, { type: "function", function: { name: "trip" } });
    assert.equal(r.parsingError, undefined, String(r.parsingError));
    checkTrip(r.parsed);
    assert.equal(r.raw.tool_calls.length, 1);
    assert.equal(r.raw.tool_calls[0].name, "trip");
    assert.deepEqual(r.raw.tool_calls[0].args, r.parsed);
  },

  async jsonModeMethod() {
    // json_object: any object; LangChain parses it
    const structured = llm.withStructuredOutput(trip, { method: "jsonMode", includeRaw: true });
    sent.length = 0;
    const r = await structured.invoke("Plan a trip, as JSON.");
    assert.equal(sent[0].response_format?.type, "json_object");
    const parsed = JSON.parse(r.raw.content);
    assert.ok(typeof parsed === "object" && parsed !== null && !Array.isArray(parsed), r.raw.content);
  },

  async batchOfStructuredCalls() {
    // several at once: each parses and validates (the server runs them side by side)
    const structured = llm.withStructuredOutput(trip, { method: "functionCalling" });
    const results = await structured.batch(["Lisbon?", "Oslo?", "Quito?"]);
    assert.equal(results.length, 3);
    results.forEach(checkTrip);
  },

  async unsupportedSchemaIsARejection() {
    const structured = llm.withStructuredOutput(
      { title: "when", type: "object", properties: { d: { type: "string", format: "date" } }, required: ["d"] },
      { method: "jsonSchema", strict: true });
    await assert.rejects(structured.invoke("When?"), (e) => e.status === 400 && /format/.test(e.message));
  },
};

let failed = 0;
for (const [name, fn] of Object.entries(cases)) {
  try {
    await fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e?.stack ?? e}`);
  }
}
console.log(`${Object.keys(cases).length} cases, ${failed} failed`);
process.exit(failed ? 1 : 0);
