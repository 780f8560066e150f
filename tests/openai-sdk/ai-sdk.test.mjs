// ai-sdk.test.mjs - drives a running kt-serve through the AI SDK (npm `ai`
// and `@ai-sdk/openai`, pinned in package-lock.json) with the provider's
// default model, which speaks the Responses API (POST /v1/responses), and
// structured outputs (Output.object, generateObject) there and on the chat model.
//
//   node ai-sdk.test.mjs BASE_URL MODEL     (BASE_URL like http://127.0.0.1:8080/v1)
//
// kt-serve must run with --test-forced-output: a fetch wrapper adds the
// request field kt_test_forced_output where a case wants the model's tokens
// forced (a tool call, reasoning), since the provider sends only the fields it
// knows.  Exits 0 when every check passed; prints the failure and exits 1 otherwise.
import assert from "node:assert/strict";
import { createOpenAI } from "@ai-sdk/openai";
import { generateObject, generateText, jsonSchema, Output, stepCountIs, streamText, tool } from "ai";

const [baseURL, model] = process.argv.slice(2);

let forced = null;      // the next request's kt_test_forced_output
const bodies = [];      // the bodies the provider sent to /responses
const chatBodies = [];  // and to /chat/completions
const provider = createOpenAI({
  baseURL, apiKey: "unused",
  fetch: async (url, init) => {
    if (String(url).endsWith("/responses") && init?.body) {
      const body = JSON.parse(init.body);
      bodies.push(body);
      if (forced) body.kt_test_forced_output = forced.shift();
      if (forced && !forced.length) forced = null;
      init = { ...init, body: JSON.stringify(body) };
    }
    if (String(url).endsWith("/chat/completions") && init?.body) chatBodies.push(JSON.parse(init.body));
    return fetch(url, init);
  },
});
const llm = provider(model); // the default: the Responses API

const forcedCall =
  "<think>The user wants the weather; call the tool.</think>Let me check." +
  "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>" +
  '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>';
const weather = tool({
  description: "Current weather of a city",
  inputSchema: jsonSchema({ type: "object", properties: { city: { type: "string" } }, required: ["city"] }),
});

// A schema whose every part is bounded (string lengths, enum, maxItems), so a random model's output ends.
const trip = {
  type: "object",
  properties: {
    city: { type: "string", maxLength: 12 },
    days: { type: "integer" },
    units: { type: "string", enum: ["metric", "imperial"] },
    tags: { type: "array", items: { type: "string", maxLength: 6 }, maxItems: 3 },
  },
  required: ["city", "days", "units", "tags"],
  additionalProperties: false,
};

// The schema's checks, written out (what the grammar promises, checked independently of kt).
function checkTrip(t) {
  assert.ok(typeof t === "object" && t !== null && !Array.isArray(t), JSON.stringify(t));
  assert.deepEqual(Object.keys(t).sort(), ["city", "days", "tags", "units"]);
  assert.ok(typeof t.city === "string" && [...t.city].length <= 12, `city ${JSON.stringify(t.city)}`);
  assert.ok(Number.isInteger(t.days), `days ${t.days}`);
  assert.ok(["metric", "imperial"].includes(t.units), `units ${t.units}`);
  assert.ok(Array.isArray(t.tags) && t.tags.length <= 3, `tags ${JSON.stringify(t.tags)}`);
  for (const tag of t.tags) assert.ok(typeof tag === "string" && [...tag].length <= 6, `tag ${JSON.stringify(tag)}`);
}

const cases = {
  async generateTextUsesResponses() {
    bodies.length = 0;
    forced = ["Hello there.<|im_end|>"];
    const r = await generateText({ model: llm, prompt: "Say hello.", maxOutputTokens: 16 });
    assert.equal(bodies.length, 1);
    assert.ok(Array.isArray(bodies[0].input), "the provider sent a Responses body");
    assert.equal(r.text, "Hello there.");
    assert.equal(r.finishReason, "stop");
    assert.ok(r.usage.inputTokens > 0 && r.usage.outputTokens > 0);
    assert.ok(r.response.id.startsWith("resp_"));
  },

  async generateTextLength() {
    forced = ["one two three four five<|im_end|>"];
    const r = await generateText({ model: llm, prompt: "Count.", maxOutputTokens: 2 });
    assert.equal(r.finishReason, "length");
  },

  async streamText() {
    forced = [forcedCall];
    const r = streamText({ model: llm, prompt: "What is the weather in Paris?", tools: { get_weather: weather } });
    let text = "", reasoning = "";
    const calls = [];
    for await (const part of r.fullStream) {
      if (part.type === "text-delta") text += part.text;
      if (part.type === "reasoning-delta") reasoning += part.text;
      if (part.type === "tool-call") calls.push(part);
      if (part.type === "error") throw part.error;
    }
    assert.equal(text, "Let me check.");
    assert.equal(reasoning, "The user wants the weather; call the tool.");
    assert.equal(calls.length, 1);
    assert.equal(calls[0].toolName, "get_weather");
    assert.deepEqual(calls[0].input, { city: "Paris" });
    assert.equal(await r.finishReason, "tool-calls");
  },

  async toolRoundTrip() {
    // two steps: the model calls the tool, the SDK runs it and sends the result back (by item reference)
    bodies.length = 0;
    forced = [forcedCall, "It is sunny in Paris.<|im_end|>"];
    const r = await generateText({
      model: llm, prompt: "What is the weather in Paris?", stopWhen: stepCountIs(2),
      tools: { get_weather: { ...weather, execute: async ({ city }) => ({ city, weather: "sunny" }) } },
    });
    assert.equal(r.steps.length, 2);
    assert.equal(r.steps[0].toolCalls[0].toolName, "get_weather");
    assert.deepEqual(r.steps[0].toolResults[0].output, { city: "Paris", weather: "sunny" });
    assert.equal(r.text, "It is sunny in Paris.");
    const sent = bodies[1].input.map((i) => i.type ?? i.role);
    assert.ok(sent.includes("function_call_output"), JSON.stringify(bodies[1].input));
    assert.ok(r.steps[1].usage.inputTokens > r.steps[0].usage.inputTokens);
  },

  // structured outputs: a random model's JSON, only parseable because kt constrains it to the schema
  async outputObjectResponses() {
    bodies.length = 0;
    const r = await generateText({
      model: llm, prompt: "Plan a trip.", maxOutputTokens: 600,
      output: Output.object({ schema: jsonSchema(trip), name: "trip" }),
    });
    assert.equal(bodies[0].text?.format?.type, "json_schema", JSON.stringify(bodies[0].text));
    checkTrip(r.output);
    assert.equal(r.finishReason, "stop");
  },

  async outputObjectStreamed() {
    const r = streamText({
      model: llm, prompt: "Plan a trip.", maxOutputTokens: 600,
      output: Output.object({ schema: jsonSchema(trip) }),
    });
    let partials = 0;
    for await (const p of r.partialOutputStream) if (p && typeof p === "object") partials++;
    checkTrip(await r.output);
    assert.ok(partials >= 1, "no partial objects");
  },

  async generateObjectOnChat() {
    // the chat model (POST /chat/completions): response_format json_schema, and logit_bias passes through
    chatBodies.length = 0;
    const r = await generateObject({
      model: provider.chat(model), schema: jsonSchema(trip), schemaName: "trip", prompt: "Plan a trip.",
      maxOutputTokens: 600, seed: 8, providerOptions: { openai: { logitBias: { 34: 4, 93: 4, 125: 4 } } },
    });
    assert.equal(chatBodies[0].response_format?.type, "json_schema", JSON.stringify(chatBodies[0].response_format));
    checkTrip(r.object);
    assert.equal(r.finishReason, "stop");
  },

  async generateObjectOnResponses() {
    const r = await generateObject({ model: llm, schema: jsonSchema(trip), prompt: "Plan a trip.", maxOutputTokens: 600 });
    checkTrip(r.object);
  },

  async errorsAreApiCallErrors() {
    await assert.rejects(
      generateText({ model: llm, prompt: "x", temperature: 5, maxRetries: 0 }),
      (e) => e.statusCode === 400 && /temperature/.test(e.message ?? e.responseBody));
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
