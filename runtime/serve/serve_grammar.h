/*
 * serve_grammar.h - the grammar a request's output must follow (grammar.h):
 * response_format json_object / json_schema (and vLLM's guided_json,
 * structured_outputs), or for tool_choice "required" / a named function a
 * well-formed call in the model family's own tool-call syntax, continuing
 * the opening serve_prompt.c puts at the end of the prompt, with each
 * tool's parameters schema as the grammar of its arguments:
 *
 * Kimi-K2 (after "<|tool_calls_section_begin|><|tool_call_begin|>functions."):
 *   NAME ":" INDEX <|tool_call_argument_begin|> ARGS <|tool_call_end|>
 *   (<|tool_call_begin|> "functions." NAME ":" INDEX ... <|tool_call_end|>)*
 *   <|tool_calls_section_end|>
 * DeepSeek (after "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"):
 *   NAME "\n```json\n" ARGS "\n```" <｜tool▁call▁end｜>
 *   (<｜tool▁call▁begin｜> "function" <｜tool▁sep｜> NAME ... <｜tool▁call▁end｜>)*
 *   <｜tool▁calls▁end｜>
 * INDEX is the call's number in the conversation (the calls before this reply
 * plus its place in it), as Kimi numbers its call ids.  A named function's prompt
 * already holds its name (and Kimi's index and argument marker), so the
 * grammar starts at ARGS and allows that one call.
 * More calls only with parallel_tool_calls.  NAME is one of the tools'
 * names: any other is impossible.  Markers that are single tokens in the
 * vocabulary must be those tokens.
 */
#ifndef KT_SERVE_GRAMMAR_H
#define KT_SERVE_GRAMMAR_H

#include "grammar.h"
#include "serve_prompt.h"
#include "serve_request.h"

/* op: how the output is parsed (serve_prompt.c sets it): where a thinking
 * model (Kimi-K2-Thinking, DeepSeek-R1) reasons, the JSON, regex or choice
 * comes after its reasoning block: <think> any text </think> (the block
 * optional; only its rest when the prompt opened it), then up to 4 spaces or
 * newlines.  Tool calls start at once (the prompt opened the call).
 * r->thinking_budget (Anthropic's budget_tokens) makes the block required and
 * at most that many tokens long, then </think> is forced and the answer
 * follows (with no response_format: anything, special tokens included). */
/* *out: NULL when the request constrains nothing.  false with e set (400
 * naming the tool whose parameters kt cannot follow; 500 out of memory). */
bool kt_serve_grammar_build(const struct kt_serve_model *m, const struct kt_api_request *r,
                            const struct kt_output_params *op, struct kt_grammar **out, struct kt_api_error *e);

#endif
