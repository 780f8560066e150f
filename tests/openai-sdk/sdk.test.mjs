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
const flatTools = [{ type: "function", name: tools[0].function.name, description: tools[0].function.description,
                    parameters: tools[0].function.parameters, strict: false }];
const forcedCall =
  "<think>The user wants the weather; call the tool.</think>Let me check." +
  "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>" +
  '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>';

const cases = {
  // ---- the Responses API ----

  async responsesCreate() {
    const r = await client.responses.create({
      model, instructions: "Be brief.", input: "Say hello.", max_output_tokens: 8, temperature: 0,
      metadata: { run: "sdk" },
    });
    assert.equal(r.object, "response");
    assert.ok(r.id.startsWith("resp_"));
    assert.ok(["completed", "incomplete"].includes(r.status));
    assert.equal(r.output[0].type, "message");
    assert.equal(r.output[0].content[0].type, "output_text");
    assert.equal(r.output_text, r.output[0].content[0].text); // the SDK's own join of the text parts
    assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0 && r.usage.output_tokens <= 8);
    assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
    assert.equal(r.metadata.run, "sdk");
    assert.equal(r.instructions, "Be brief.");
  },

  async responsesIncomplete() {
    const r = await client.responses.create({
      model, input: "x", max_output_tokens: 2, kt_test_forced_output: "one two three four<|im_end|>",
    });
    assert.equal(r.status, "incomplete");
    assert.equal(r.incomplete_details.reason, "max_output_tokens");
  },

  async responsesStream() {
    const stream = client.responses.stream({ model, input: "What is the weather in Paris?", tools: flatTools,
                                             kt_test_forced_output: forcedCall });
    const types = [];
    let text = "", args = "", reasoning = "", last = -1;
    for await (const event of stream) {
      assert.equal(event.sequence_number, last + 1);
      last = event.sequence_number;
      types.push(event.type);
      if (event.type === "response.output_text.delta") text += event.delta;
      if (event.type === "response.function_call_arguments.delta") args += event.delta;
      if (event.type === "response.reasoning_summary_text.delta") reasoning += event.delta;
    }
    const final = await stream.finalResponse();
    assert.equal(types[0], "response.created");
    assert.equal(types.at(-1), "response.completed");
    assert.equal(text, "Let me check.");
    assert.equal(reasoning, "The user wants the weather; call the tool.");
    assert.deepEqual(JSON.parse(args), { city: "Paris" });
    assert.deepEqual(final.output.map((o) => o.type), ["reasoning", "message", "function_call"]);
    assert.equal(final.output_text, "Let me check.");
    assert.equal(final.output[2].call_id, "functions.get_weather:0");
    assert.equal(final.output[2].name, "get_weather");
  },

  async responsesToolRoundTrip() {
    const r = await client.responses.create({ model, input: "What is the weather in Paris?", tools: flatTools,
                                              kt_test_forced_output: forcedCall });
    const call = r.output.find((o) => o.type === "function_call");
    assert.deepEqual(JSON.parse(call.arguments), { city: "Paris" });
    const result = { type: "function_call_output", call_id: call.call_id, output: '{"weather": "sunny"}' };
    // the documented way: the output items go back as input, then the tool's result
    const whole = await client.responses.create({
      model, tools: flatTools, max_output_tokens: 4, store: false,
      input: [{ role: "user", content: "What is the weather in Paris?" }, ...r.output, result],
    });
    assert.equal(whole.output[0].type, "message");
    // and through previous_response_id: the same prompt
    const chained = await client.responses.create({
      model, tools: flatTools, max_output_tokens: 4, previous_response_id: r.id, input: [result],
    });
    assert.equal(chained.previous_response_id, r.id);
    assert.equal(chained.usage.input_tokens, whole.usage.input_tokens);
    assert.ok(chained.usage.input_tokens_details.cached_tokens > 0);
  },

  async responsesStored() {
    const r = await client.responses.create({ model, input: "hi", max_output_tokens: 2 });
    const got = await client.responses.retrieve(r.id);
    assert.equal(got.id, r.id);
    assert.deepEqual(got.output, r.output);
    const items = await client.responses.inputItems.list(r.id);
    assert.equal(items.data[0].role, "user");
    await client.responses.delete(r.id);
    await assert.rejects(client.responses.retrieve(r.id), (e) => e instanceof OpenAI.NotFoundError);
  },

  async responsesErrors() {
    await assert.rejects(
      client.responses.create({ model, input: "x", tools: [{ type: "web_search" }] }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === "tools[0]");
    await assert.rejects(
      client.responses.create({ model, input: "x", previous_response_id: "resp_nothing" }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === "previous_response_id");
    await assert.rejects(
      client.responses.create({ model, input: "x", max_output_tokens: 1_000_000 }),
      (e) => e instanceof OpenAI.BadRequestError && e.code === "context_length_exceeded");
  },

  async responsesAbortMidStream() {
    const metrics = baseURL.replace(/\/v1$/, "") + "/metrics";
    const aborted = async () => Number((await (await fetch(metrics)).text())
      .match(/finished_reason="abort"} ([0-9.e+]+)/)?.[1] ?? 0);
    const before = await aborted();
    const controller = new AbortController();
    const stream = await client.responses.create(
      { model, input: "go", max_output_tokens: 2000, ignore_eos: true, stream: true },
      { signal: controller.signal });
    let n = 0;
    try {
      for await (const event of stream) {
        if (++n === 6) controller.abort();
      }
    } catch (e) {
      assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === "AbortError", String(e));
    }
    assert.ok(n >= 6 && n < 100, `${n} events after the abort`);
    let idle = false;
    for (let i = 0; i < 100 && !idle; i++) {
      await new Promise((r) => setTimeout(r, 100));
      const text = await (await fetch(metrics)).text();
      idle = text.includes(`vllm:num_requests_running{model_name="${model}"} 0`) && (await aborted()) > before;
    }
    assert.ok(idle, "the aborted Responses stream is still running");
  },

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
