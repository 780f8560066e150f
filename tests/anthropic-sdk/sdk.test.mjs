// sdk.test.mjs - drives a running kt-serve's Messages API through the official @anthropic-ai/sdk.
//
//   node sdk.test.mjs BASE_URL MODEL     (BASE_URL like http://127.0.0.1:8080: the SDK adds /v1/messages)
//
// kt-serve must run with --test-forced-output: the synthetic model's text is
// noise, so tool calls and thinking are produced by forcing the model's
// tokens (the request field kt_test_forced_output), which still go through
// the engine, the detokenizer and kt-serve's parsers.  Exits 0 when every
// check passed; prints the failure and exits 1 otherwise.
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, model] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 120_000 });

const tools = [{
  name: "get_weather",
  description: "Current weather of a city",
  input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
}];
const question = [{ role: "user", content: "What is the weather in Paris?" }];
const forcedCall =
  "<think>The user wants the weather; call the tool.</think>Let me check." +
  "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>" +
  '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>';

const cases = {
  async create() {
    const m = await client.messages.create({
      model, max_tokens: 6, temperature: 0, system: "Be brief.",
      messages: [{ role: "user", content: "Say hello." }],
    });
    assert.equal(m.type, "message");
    assert.equal(m.role, "assistant");
    assert.equal(m.model, model);
    assert.match(m.id, /^msg_/);
    assert.equal(m.content[0].type, "text");
    assert.equal(typeof m.content[0].text, "string");
    assert.ok(["end_turn", "max_tokens"].includes(m.stop_reason), m.stop_reason);
    assert.ok(m.usage.output_tokens > 0 && m.usage.output_tokens <= 6);
    assert.ok(m.usage.input_tokens + m.usage.cache_read_input_tokens > 0);
  },

  async streamReconstructsText() {
    const forced = "Rivers run to the sea, and the sea is never full.";
    const stream = client.messages.stream({
      model, max_tokens: 100, messages: [{ role: "user", content: "A line, please." }],
      kt_test_forced_output: forced + "<|im_end|>",
    });
    let text = "";
    const events = [];
    stream.on("text", (delta) => { text += delta; });
    stream.on("streamEvent", (e) => { events.push(e.type); });
    const final = await stream.finalMessage();
    assert.equal(text, forced);
    assert.equal(final.content.length, 1);
    assert.equal(final.content[0].text, forced);
    assert.equal(final.stop_reason, "end_turn");
    assert.ok(final.usage.output_tokens > 0);
    assert.equal(events[0], "message_start");
    assert.equal(events.at(-1), "message_stop");
    assert.equal(events.at(-2), "message_delta");
  },

  async rawStreamEvents() {
    const stream = await client.messages.create({
      model, max_tokens: 5, stream: true, messages: [{ role: "user", content: "Count." }],
    });
    const types = [];
    for await (const e of stream) types.push(e.type);
    assert.equal(types[0], "message_start");
    assert.equal(types.at(-1), "message_stop");
    assert.ok(types.includes("content_block_delta"), types.join(","));
  },

  async toolRoundTrip() {
    const m = await client.messages.create({ model, max_tokens: 200, tools, messages: question,
      kt_test_forced_output: forcedCall });
    assert.equal(m.stop_reason, "tool_use");
    assert.deepEqual(m.content.map((b) => b.type), ["thinking", "text", "tool_use"]);
    assert.equal(m.content[0].thinking, "The user wants the weather; call the tool.");
    assert.equal(m.content[1].text, "Let me check.");
    const use = m.content[2];
    assert.equal(use.name, "get_weather");
    assert.deepEqual(use.input, { city: "Paris" });
    assert.match(use.id, /^toolu_[A-Za-z0-9_-]+$/);

    // the reply goes back whole, with the tool's result, and the conversation goes on
    const next = await client.messages.create({
      model, max_tokens: 50, tools,
      messages: [
        ...question,
        { role: "assistant", content: m.content },
        { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: '{"weather": "sunny"}' }] },
      ],
      kt_test_forced_output: "It is sunny in Paris.<|im_end|>",
    });
    assert.equal(next.stop_reason, "end_turn");
    assert.equal(next.content[0].text, "It is sunny in Paris.");
  },

  async streamedToolUse() {
    const stream = client.messages.stream({ model, max_tokens: 200, tools, messages: question,
      kt_test_forced_output: forcedCall });
    let thinking = "", text = "", json = "";
    stream.on("thinking", (delta) => { thinking += delta; });
    stream.on("text", (delta) => { text += delta; });
    stream.on("inputJson", (delta) => { json += delta; });
    const final = await stream.finalMessage();
    assert.equal(thinking, "The user wants the weather; call the tool.");
    assert.equal(text, "Let me check.");
    assert.deepEqual(JSON.parse(json), { city: "Paris" });
    assert.equal(final.stop_reason, "tool_use");
    const use = final.content.find((b) => b.type === "tool_use");
    assert.deepEqual(use.input, { city: "Paris" });
    assert.equal(final.content[0].type, "thinking");
    assert.equal(typeof final.content[0].signature, "string");
  },

  async stopSequence() {
    const m = await client.messages.create({
      model, max_tokens: 50, stop_sequences: ["STOP"], messages: [{ role: "user", content: "x" }],
      kt_test_forced_output: "up to here STOP not this<|im_end|>",
    });
    assert.equal(m.stop_reason, "stop_sequence");
    assert.equal(m.stop_sequence, "STOP");
    assert.equal(m.content[0].text, "up to here ");
  },

  async currentApiFields() {
    // what this SDK version sends for a current model: adaptive thinking, effort, automatic caching
    const stream = client.messages.stream({
      model, max_tokens: 200, tools, messages: question,
      thinking: { type: "adaptive", display: "omitted" }, output_config: { effort: "high" },
      cache_control: { type: "ephemeral" }, kt_test_forced_output: forcedCall,
    });
    const final = await stream.finalMessage();
    assert.deepEqual(final.content.map((b) => b.type), ["thinking", "text", "tool_use"]);
    assert.equal(final.content[0].thinking, "");
    assert.equal(final.content[0].signature, "kt-serve");
    assert.equal(final.stop_reason, "tool_use");
  },

  async countTokens() {
    const params = { model, system: "Be brief.", messages: [{ role: "user", content: "Say hello." }] };
    const count = await client.messages.countTokens(params);
    assert.ok(count.input_tokens > 0);
    const m = await client.messages.create({ ...params, max_tokens: 1 });
    assert.equal(count.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
    const withTools = await client.messages.countTokens({ ...params, tools });
    assert.ok(withTools.input_tokens > count.input_tokens);
  },

  async errors() {
    await assert.rejects(
      client.messages.create({ model, max_tokens: 4, temperature: 5, messages: [{ role: "user", content: "x" }] }),
      (e) => e instanceof Anthropic.BadRequestError && e.status === 400 && e.error?.type === "error" &&
        e.error?.error?.type === "invalid_request_error");
    await assert.rejects(
      client.messages.create({ model: "claude-sonnet-4-5", max_tokens: 4, messages: [{ role: "user", content: "x" }] }),
      (e) => e instanceof Anthropic.NotFoundError && e.error?.error?.type === "not_found_error");
    await assert.rejects(
      client.messages.create({ model, max_tokens: 4, messages: [{ role: "user", content: [
        { type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } }] }] }),
      (e) => e instanceof Anthropic.BadRequestError && /image/.test(e.message));
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
