// sdk.test.mjs - drives a running kt-serve through the official openai SDK.
//
//   node sdk.test.mjs BASE_URL MODEL     (BASE_URL like http://127.0.0.1:8080/v1)
//
// kt-serve must run with --test-forced-output: the synthetic model's text is
// noise, so tool calls and reasoning are produced by forcing the model's
// tokens (the request field kt_test_forced_output), which still go through
// the engine, the detokenizer and kt-serve's parsers.  Exits 0 when every
// check passed; prints the failure and exits 1 otherwise.
import assert from "node:assert/strict";
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 120_000 });

const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather of a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
}];
const forcedCall =
  "<think>The user wants the weather; call the tool.</think>Let me check." +
  "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>" +
  '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>';

const cases = {
  async models() {
    const list = await client.models.list();
    assert.equal(list.data[0].id, model);
  },

  async chat() {
    const r = await client.chat.completions.create({
      model, max_tokens: 8, temperature: 0,
      messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Say hello." }],
    });
    assert.equal(r.object, "chat.completion");
    assert.equal(r.choices[0].message.role, "assistant");
    assert.equal(typeof r.choices[0].message.content, "string");
    assert.ok(["stop", "length"].includes(r.choices[0].finish_reason));
    assert.ok(r.usage.prompt_tokens > 0 && r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 8);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  },

  async streamingWithUsage() {
    const stream = await client.chat.completions.create({
      model, max_tokens: 12, stream: true, stream_options: { include_usage: true },
      messages: [{ role: "user", content: "Count to five." }],
    });
    let text = "", finish = null, usage = null, chunks = 0, id = null;
    for await (const chunk of stream) {
      chunks++;
      id ??= chunk.id;
      assert.equal(chunk.id, id);
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text += c.delta?.content ?? "";
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.ok(chunks >= 3, `only ${chunks} chunks`);
    assert.ok(["stop", "length"].includes(finish));
    assert.ok(usage && usage.completion_tokens > 0 && usage.completion_tokens <= 12);
    assert.equal(typeof text, "string");
  },

  async toolCall() {
    const r = await client.chat.completions.create({
      model, tools, tool_choice: "auto",
      messages: [{ role: "user", content: "What is the weather in Paris?" }],
      kt_test_forced_output: forcedCall,
    });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, "tool_calls");
    assert.equal(m.content, "Let me check.");
    assert.equal(m.reasoning_content, "The user wants the weather; call the tool.");
    assert.equal(m.tool_calls.length, 1);
    assert.equal(m.tool_calls[0].id, "functions.get_weather:0");
    assert.equal(m.tool_calls[0].type, "function");
    assert.equal(m.tool_calls[0].function.name, "get_weather");
    assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: "Paris" });

    // the tool's answer goes back, and the conversation goes on
    const r2 = await client.chat.completions.create({
      model, tools, max_tokens: 4,
      messages: [
        { role: "user", content: "What is the weather in Paris?" },
        { role: "assistant", content: m.content, tool_calls: m.tool_calls },
        { role: "tool", tool_call_id: m.tool_calls[0].id, content: '{"weather": "sunny"}' },
      ],
    });
    assert.equal(r2.choices[0].message.role, "assistant");
  },

  async streamedToolCallAndReasoning() {
    const stream = await client.chat.completions.create({
      model, tools, stream: true, stream_options: { include_usage: true },
      messages: [{ role: "user", content: "What is the weather in Paris?" }],
      kt_test_forced_output: forcedCall,
    });
    let reasoning = "", content = "", finish = null, usage = null;
    const calls = [];
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        reasoning += c.delta?.reasoning_content ?? "";
        content += c.delta?.content ?? "";
        for (const t of c.delta?.tool_calls ?? []) {
          calls[t.index] ??= { id: "", name: "", arguments: "" };
          if (t.id) calls[t.index].id = t.id;
          if (t.function?.name) calls[t.index].name = t.function.name;
          calls[t.index].arguments += t.function?.arguments ?? "";
        }
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(reasoning, "The user wants the weather; call the tool.");
    assert.equal(content, "Let me check.");
    assert.equal(finish, "tool_calls");
    assert.deepEqual(calls, [{ id: "functions.get_weather:0", name: "get_weather", arguments: '{"city": "Paris"}' }]);
    assert.ok(usage.completion_tokens > 0);

    // the SDK's own accumulator agrees
    const runner = client.chat.completions.stream({
      model, tools,
      messages: [{ role: "user", content: "What is the weather in Paris?" }],
      kt_test_forced_output: forcedCall,
    });
    const final = await runner.finalChatCompletion();
    const call = final.choices[0].message.tool_calls[0];
    assert.equal(call.function.name, "get_weather");
    assert.deepEqual(JSON.parse(call.function.arguments), { city: "Paris" });
  },

  async thinkingOff() {
    const r = await client.chat.completions.create({
      model, messages: [{ role: "user", content: "hi" }],
      chat_template_kwargs: { thinking: false },
      kt_test_forced_output: "<think>x</think>y<|im_end|>",
    });
    assert.equal(r.choices[0].message.content, "<think>x</think>y");
    assert.equal(r.choices[0].message.reasoning_content, undefined);
  },

  async completions() {
    const r = await client.completions.create({ model, prompt: "The river", max_tokens: 5, temperature: 0, logprobs: 2 });
    assert.equal(r.object, "text_completion");
    assert.equal(typeof r.choices[0].text, "string");
    assert.equal(r.choices[0].logprobs.tokens.length, r.usage.completion_tokens - (r.choices[0].finish_reason === "stop" ? 1 : 0));
  },

  async errors() {
    await assert.rejects(
      client.chat.completions.create({ model, temperature: 5, messages: [{ role: "user", content: "x" }] }),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === "temperature");
    await assert.rejects(
      client.chat.completions.create({ model: "gpt-4o", messages: [{ role: "user", content: "x" }] }),
      (e) => e instanceof OpenAI.NotFoundError && e.code === "model_not_found");
    await assert.rejects(
      client.chat.completions.create({ model, max_tokens: 1_000_000, messages: [{ role: "user", content: "x" }] }),
      (e) => e instanceof OpenAI.BadRequestError && e.code === "context_length_exceeded");
  },

  // structured outputs: the SDK's parse() reads the JSON the grammar forced out of a random model
  async structuredOutputParse() {
    const schema = {
      type: "object",
      properties: {
        city: { type: "string", maxLength: 10 },
        days: { type: "integer" },
        units: { enum: ["metric", "imperial"] },
        tags: { type: "array", items: { type: "string", maxLength: 5 }, maxItems: 2 },
      },
      required: ["city", "days", "units", "tags"],
      additionalProperties: false,
    };
    const r = await client.chat.completions.parse({
      model, max_tokens: 600, seed: 3,
      messages: [{ role: "user", content: "Plan a trip." }],
      response_format: { type: "json_schema", json_schema: { name: "trip", strict: true, schema } },
      logit_bias: { 34: 4, 93: 4, 125: 4 },
    });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, "stop");
    assert.equal(typeof m.parsed, "object");
    assert.deepEqual(Object.keys(m.parsed), ["city", "days", "units", "tags"]);
    assert.ok(typeof m.parsed.city === "string" && [...m.parsed.city].length <= 10);
    assert.ok(Number.isInteger(m.parsed.days));
    assert.ok(["metric", "imperial"].includes(m.parsed.units));
    assert.ok(Array.isArray(m.parsed.tags) && m.parsed.tags.length <= 2);
    await assert.rejects(
      client.chat.completions.create({
        model, messages: [{ role: "user", content: "x" }],
        response_format: { type: "json_schema", json_schema: { name: "d", schema: { type: "string", format: "date" } } },
      }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === "response_format" && /#\/format/.test(e.message));
  },

  async toolChoiceRequired() {
    const r = await client.chat.completions.create({
      model, tools, tool_choice: "required", max_tokens: 300, seed: 2,
      messages: [{ role: "user", content: "Weather?" }],
      logit_bias: { 34: 4, 93: 4, 125: 4 },
    });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, "tool_calls");
    assert.equal(m.tool_calls[0].function.name, "get_weather");
    assert.equal(typeof JSON.parse(m.tool_calls[0].function.arguments).city, "string");
  },

  async abortMidStream() {
    const controller = new AbortController();
    const stream = await client.chat.completions.create(
      { model, max_tokens: 2000, ignore_eos: true, stream: true, messages: [{ role: "user", content: "go" }] },
      { signal: controller.signal });
    let n = 0;
    try {
      for await (const chunk of stream) {
        if (++n === 3) controller.abort();
      }
    } catch (e) {
      assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === "AbortError", String(e));
    }
    assert.ok(n >= 3 && n < 100, `${n} chunks after the abort`);
    // the server notices the hang-up and cancels: nothing left running
    const metrics = baseURL.replace(/\/v1$/, "") + "/metrics";
    let idle = false;
    for (let i = 0; i < 100 && !idle; i++) {
      await new Promise((r) => setTimeout(r, 100));
      const text = await (await fetch(metrics)).text();
      idle = text.includes(`vllm:num_requests_running{model_name="${model}"} 0`) &&
        /finished_reason="abort"} [1-9]/.test(text);
    }
    assert.ok(idle, "the aborted request is still running");
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
