/*
 * templates.c - the Jinja chat templates of the families kt-synth imitates.
 *
 * Each string is kept as the model's tokenizer files carry it, split into
 * adjacent C literals only where that changes no byte.  These strings must
 * never be edited by hand: replacing one means copying another published
 * revision verbatim and saying where it came from.
 */
#include "templates.h"

#include <stddef.h>

/*
 * DeepSeek-V3-0324: the tokenizer.chat_template of a DeepSeek-V3-0324 GGUF,
 * byte for byte the text kept in tests/golden/chat/deepseek-v3-0324.jinja
 * (where its source is recorded).  The newlines inside its Jinja string
 * literals are real newline characters, as in that GGUF.  It appends
 * "<｜Assistant｜>" to every user turn, unlike DeepSeek-R1's revision.
 * llama.cpp selects its DeepSeek handler by the marker <｜tool▁calls▁begin｜>;
 * "function<｜tool▁sep｜>" (the published template) appears only in renders, where
 * tool['type'] is "function".
 */
static const char deepseek_v3_template[] =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true, is_last_user=false) %}{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}{%- else %}{% set ns.system_prompt = ns.system_prompt + '\n"
    "\n"
    "' + message['content'] %}{%- endif %}{%- endif %}{%- endfor %}{{ bos_token }}{{ ns.system_prompt }}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{%- set ns.is_first = false -%}{%- set ns.is_last_user = true -%}{{'<｜User｜>' + message['content'] + '<｜Assistant｜>'}}{%- endif %}{%- if message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] is not none %}{%- set ns.is_last_user = false -%}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{%- endif %}{%- set ns.is_first = false %}{%- set ns.is_tool = false -%}{%- set ns.is_output_first = true %}{%- for tool in message['tool_calls'] %}{%- if not ns.is_first %}{%- if message['content'] is none %}{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n"
    "' + '```json' + '\n"
    "' + tool['function']['arguments'] + '\n"
    "' + '```' + '<｜tool▁call▁end｜>'}}{%- else %}{{message['content'] + '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n"
    "' + '```json' + '\n"
    "' + tool['function']['arguments'] + '\n"
    "' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}{%- set ns.is_first = true -%}{%- else %}{{'\n"
    "' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n"
    "' + '```json' + '\n"
    "' + tool['function']['arguments'] + '\n"
    "' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}{%- endfor %}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- if message['role'] == 'assistant' and (message['tool_calls'] is not defined or message['tool_calls'] is none)%}{%- set ns.is_last_user = false -%}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{% set content = message['content'] %}{{content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_last_user = false -%}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}{{'\n"
    "<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_last_user and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}";

/*
 * Kimi-K2-Instruct (first release, July 2025).  No verbatim copy of this
 * revision's chat_template.jinja was available; this text is the published
 * "Official Instruct template", whose opening bytes match the
 * tokenizer.chat_template of unsloth's Kimi-K2-Instruct GGUF
 * ("{%- if tools -%}\n  <|im_system|>tool_declare<|im_middle|>{{ "), with the
 * list-content branch (elided in the reference) filled in from the text that
 * is identical in every later revision found (the Kimi-K2-Instruct-0905
 * chat_template.jinja and the copy in llama.cpp's Kimi-K2 json-schema
 * regression test).  Its rendering is exact; its whitespace between
 * "-%}" / "{%-" pairs (which Jinja strips) may differ from the original file.
 */
static const char kimi_k2_template[] =
    "{%- if tools -%}\n"
    "  <|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>\n"
    "{%- endif -%}\n"
    "{%- for message in messages -%}\n"
    "  {%- if loop.first and messages[0]['role'] != 'system' -%}\n"
    "    <|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>\n"
    "  {%- endif -%}\n"
    "  {%- set role_name =  message.get('name') or  message['role'] -%}\n"
    "  {%- if message['role'] == 'user' -%}\n"
    "    <|im_user|>{{role_name}}<|im_middle|>\n"
    "  {%- elif message['role'] == 'assistant' -%}\n"
    "    <|im_assistant|>{{role_name}}<|im_middle|>\n"
    "  {%- else -%}\n"
    "    <|im_system|>{{role_name}}<|im_middle|>\n"
    "  {%- endif -%}\n"
    "  {%- if message['role'] == 'assistant' and message.get('tool_calls') -%}\n"
    "    {%- if message['content'] -%}{{ message['content'] }}{%- endif -%}\n"
    "    <|tool_calls_section_begin|>\n"
    "    {%- for tool_call in message['tool_calls'] -%}\n"
    "      {%- set formatted_id = tool_call['id'] -%}\n"
    "      <|tool_call_begin|>{{ formatted_id }}<|tool_call_argument_begin|>{% if tool_call['function']['arguments'] is string %}{{ tool_call['function']['arguments'] }}{% else %}{{ tool_call['function']['arguments'] | tojson }}{% endif %}<|tool_call_end|>\n"
    "    {%- endfor -%}\n"
    "    <|tool_calls_section_end|>\n"
    "  {%- elif message['role'] == 'tool' -%}\n"
    "    ## Return of {{ message.tool_call_id }}\n"
    "    {{ message['content'] }}\n"
    "  {%- elif message['content'] is string -%}\n"
    "    {{ message['content'] }}\n"
    "  {%- elif message['content'] is not none -%}\n"
    "    {% for content in message['content'] -%}\n"
    "      {% if content['type'] == 'image' or 'image' in content or 'image_url' in content -%}\n"
    "        <|media_start|>image<|media_content|><|media_pad|><|media_end|>\n"
    "      {% else -%}\n"
    "        {{ content['text'] }}\n"
    "      {%- endif -%}\n"
    "    {%- endfor -%}\n"
    "  {%- endif -%}\n"
    "  <|im_end|>\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  <|im_assistant|>assistant<|im_middle|>\n"
    "{%- endif -%}";

/*
 * Kimi-K2-Thinking: byte for byte tests/golden/chat/kimi-k2-thinking.jinja
 * (llama.cpp's copy of the official template; provenance in that folder's
 * README.md).  It keeps reasoning in <think>...</think> before the answer.
 */
static const char kimi_k2_thinking_template[] =
    "{%- macro render_content(msg) -%}\n"
    "    {%- set c = msg.get('content') -%}\n"
    "    {%- if c is string -%}\n"
    "      {{ c }}\n"
    "    {%- elif c is not none -%}\n"
    "      {% for content in c -%}\n"
    "        {% if content['type'] == 'image' or 'image' in content or 'image_url' in content -%}\n"
    "          <|media_start|>image<|media_content|><|media_pad|><|media_end|>\n"
    "        {% else -%}\n"
    "          {{ content['text'] }}\n"
    "        {%- endif -%}\n"
    "      {%- endfor -%}\n"
    "    {%- endif -%}\n"
    "{%- endmacro -%}\n"
    "\n"
    "{% macro set_roles(message) -%}\n"
    "  {%- set role_name =  message.get('name') or  message['role'] -%}\n"
    "  {%- if message['role'] == 'user' -%}\n"
    "    <|im_user|>{{role_name}}<|im_middle|>\n"
    "  {%- elif message['role'] == 'assistant' -%}\n"
    "    <|im_assistant|>{{role_name}}<|im_middle|>\n"
    "  {%- else -%}\n"
    "    <|im_system|>{{role_name}}<|im_middle|>\n"
    "  {%- endif -%}\n"
    "{%- endmacro -%}\n"
    "\n"
    "\n"
    "{%- macro render_toolcalls(message) -%}\n"
    "  <|tool_calls_section_begin|>\n"
    "  {%- for tool_call in message['tool_calls'] -%}\n"
    "    {%- set formatted_id = tool_call['id'] -%}\n"
    "    <|tool_call_begin|>{{ formatted_id }}<|tool_call_argument_begin|>{% if tool_call['function']['arguments'] is string %}{{ tool_call['function']['arguments'] }}{% else %}{{ tool_call['function']['arguments'] | tojson }}{% endif %}<|tool_call_end|>\n"
    "  {%- endfor -%}\n"
    "  <|tool_calls_section_end|>\n"
    "{%- endmacro -%}\n"
    "\n"
    "\n"
    "{# Find last non-tool-call assisitant message #}\n"
    "{%- set ns = namespace(last_non_tool_call_assistant_msg=-1) -%}\n"
    "{%- for idx in range(messages|length-1, -1, -1) -%}\n"
    "    {%- if messages[idx]['role'] == 'assistant' and not messages[idx].get('tool_calls') -%}\n"
    "        {%- set ns.last_non_tool_call_assistant_msg = idx -%}\n"
    "        {%- break -%}\n"
    "    {%- endif -%}\n"
    "{%- endfor -%}\n"
    "\n"
    "{# split all messages into history & suffix, reasoning_content in suffix should be reserved.#}\n"
    "{%- set hist_msgs = messages[:ns.last_non_tool_call_assistant_msg+1] -%}\n"
    "{%- set suffix_msgs = messages[ns.last_non_tool_call_assistant_msg+1:] -%}\n"
    "\n"
    "{%- if tools -%}\n"
    "  <|im_system|>tool_declare<|im_middle|>{{ tools | tojson() }}<|im_end|>\n"
    "{%- endif -%}\n"
    "\n"
    "{%- if messages|length == 0 or messages[0]['role'] != 'system' -%}\n"
    "  <|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>\n"
    "{%- endif -%}\n"
    "  \n"
    "{%- for message in hist_msgs -%}\n"
    "  {{set_roles(message)}}\n"
    "  {%- if message['role'] == 'assistant' -%}\n"
    "    <think></think>{{render_content(message)}}\n"
    "    {%- if message.get('tool_calls') -%}\n"
    "      {{render_toolcalls(message)}}\n"
    "    {%- endif -%}\n"
    "  {%- elif message['role'] == 'tool' -%}\n"
    "    {%- set tool_call_id = message.tool_call_id -%}\n"
    "    ## Return of {{ tool_call_id }}\n"
    "{{render_content(message)}}\n"
    "  {%- elif message['content'] is not none -%}\n"
    "    {{render_content(message)}}\n"
    "  {%- endif -%}\n"
    "  <|im_end|>\n"
    "{%- endfor -%}\n"
    "\n"
    "{%- for message in suffix_msgs -%}\n"
    "  {{set_roles(message)}}\n"
    "  {%- if message['role'] == 'assistant' -%}\n"
    "    {%- set rc = message.get('reasoning_content', '') -%}\n"
    "    <think>{{rc}}</think>{{render_content(message)}}\n"
    "    {%- if message.get('tool_calls') -%}\n"
    "     {{render_toolcalls(message)}}\n"
    "    {%- endif -%}\n"
    "  {%- elif message['role'] == 'tool' -%}\n"
    "    {%- set tool_call_id = message.tool_call_id -%}\n"
    "    ## Return of {{ tool_call_id }}\n"
    "{{render_content(message)}}\n"
    "  {%- elif message['content'] is not none -%}\n"
    "    {{render_content(message)}}\n"
    "  {%- endif -%}\n"
    "  <|im_end|>\n"
    "{%- endfor -%}\n"
    "\n"
    "\n"
    "{%- if add_generation_prompt -%}\n"
    "  <|im_assistant|>assistant<|im_middle|>\n"
    "{%- endif -%}\n";

/*
 * DeepSeek-R1 (January 2025): byte for byte tests/golden/chat/deepseek-r1.jinja
 * (provenance in that folder's README.md).  Unlike V3-0324's, its "\n" are the
 * two characters backslash and n inside Jinja string literals.
 */
static const char deepseek_r1_template[] =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) %}{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}{%- else %}{% set ns.system_prompt = ns.system_prompt + '\\n\\n' + message['content'] %}{%- endif %}{%- endif %}{%- endfor %}{{ bos_token }}{{ ns.system_prompt }}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and 'tool_calls' in message %}{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls'] %}{%- if not ns.is_first %}{%- if message['content'] is none %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- else %}{{'<｜Assistant｜>' + message['content'] + '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}{%- set ns.is_first = true -%}{%- else %}{{'\\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}{%- endfor %}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- if message['role'] == 'assistant' and 'tool_calls' not in message %}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}{{'<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}";

const char *kt_synth_chat_template(enum kt_synth_family family)
{
    switch (family) {
    case KT_SYNTH_KIMI: return kimi_k2_template;
    case KT_SYNTH_DEEPSEEK: return deepseek_v3_template;
    }
    return NULL;
}

const char *kt_synth_chat_template_revision(enum kt_synth_chat_revision revision)
{
    switch (revision) {
    case KT_SYNTH_CHAT_KIMI_K2_THINKING: return kimi_k2_thinking_template;
    case KT_SYNTH_CHAT_DEEPSEEK_R1: return deepseek_r1_template;
    }
    return NULL;
}
