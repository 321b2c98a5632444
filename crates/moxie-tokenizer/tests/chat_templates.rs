//! Chat templates written like the real ones (Qwen3, DeepSeek-V3/R1, GLM-4.5, Mistral-style
//! alternation check) plus a grab bag of jinja2 features. Expected strings were produced once
//! with Python jinja2 3.1 in transformers' configuration (ImmutableSandboxedEnvironment,
//! trim_blocks, lstrip_blocks, loopcontrols, transformers' `tojson`), `bos_token = "<s>"`,
//! `eos_token = "</s>"`, `tools`/`documents` None unless given, `content: None` rendered as "".

use moxie_tokenizer::{ChatTemplate, TemplateError};
use serde_json::{Map, Value};

fn render(template: &str, messages: &str, add_generation_prompt: bool, extra: &str) -> String {
    let messages: Vec<Value> = serde_json::from_str(messages).unwrap();
    let extra: Map<String, Value> = serde_json::from_str(extra).unwrap();
    let t = ChatTemplate::new(template, "<s>", "</s>").unwrap();
    t.render(&messages, add_generation_prompt, &extra).unwrap()
}

const QWEN3: &str = r##"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"##;

const DEEPSEEK: &str = r#"{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) %}{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}{%- else %}{% set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] %}{%- endif %}{%- endif %}{%- endfor %}{{ bos_token }}{{ ns.system_prompt }}{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and 'tool_calls' in message %}{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls'] %}{%- if not ns.is_first %}{%- if message['content'] is none %}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}{%- else %}{{'<｜Assistant｜>' + message['content'] + '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}{%- set ns.is_first = true -%}{%- else %}{{'\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}{%- endif %}{%- endfor %}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- if message['role'] == 'assistant' and 'tool_calls' not in message %}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}{%- else %}{{'<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{%- if not thinking %}{{'</think>'}}{%- endif %}{% endif %}"#;

const GLM: &str = r#"[gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}
{{ tool | tojson(ensure_ascii=False) }}
{% endfor %}
</tools>

For each function call, output the function name and arguments within the following XML format:
<tool_call>{function-name}
<arg_key>{arg-key-1}</arg_key>
<arg_value>{arg-value-1}</arg_value>
...
</tool_call>{%- endif -%}
{%- macro visible_text(content) -%}
    {%- if content is string -%}
        {{- content }}
    {%- elif content is iterable and content is not mapping -%}
        {%- for item in content -%}
            {%- if item is mapping and item.type == 'text' -%}
                {{- item.text }}
            {%- elif item is string -%}
                {{- item }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content }}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user_index=-1) %}
{%- for m in messages %}
    {%- if m.role == 'user' %}
        {% set ns.last_user_index = loop.index0 -%}
    {%- endif %}
{%- endfor %}
{% for m in messages %}
{%- if m.role == 'user' -%}<|user|>
{{ visible_text(m.content) }}
{{- '/nothink' if (enable_thinking is defined and not enable_thinking and not visible_text(m.content).endswith("/nothink")) else '' -}}
{%- elif m.role == 'assistant' -%}
<|assistant|>
{%- set reasoning_content = '' %}
{%- set content = visible_text(m.content) %}
{%- if m.reasoning_content is string %}
    {%- set reasoning_content = m.reasoning_content %}
{%- else %}
    {%- if '</think>' in content %}
        {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
        {%- set content = content.split('</think>')[-1].lstrip('\n') %}
    {%- endif %}
{%- endif %}
{%- if loop.index0 > ns.last_user_index and reasoning_content -%}
{{ '\n<think>' + reasoning_content.strip() +  '</think>'}}
{%- else -%}
{{ '\n<think></think>' }}
{%- endif -%}
{%- if content.strip() -%}
{{ '\n' + content.strip() }}
{%- endif -%}
{% if m.tool_calls %}
{% for tc in m.tool_calls %}
{%- if tc.function %}
    {%- set tc = tc.function %}
{%- endif %}
{{ '\n<tool_call>' + tc.name }}
{% set _args = tc.arguments %}
{% for k, v in _args.items() %}
<arg_key>{{ k }}</arg_key>
<arg_value>{{ v | tojson(ensure_ascii=False) if v is not string else v }}</arg_value>
{% endfor %}
</tool_call>{% endfor %}
{% endif %}
{%- elif m.role == 'tool' -%}
{%- if m.content is string -%}
{%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
    {{- '<|observation|>' }}
{%- endif %}
{{- '\n<tool_response>\n' }}
{{- m.content }}
{{- '\n</tool_response>' }}
{%- else -%}
<|observation|>{% for tr in m.content %}

<tool_response>
{{ tr.output if tr.output is defined else tr }}
</tool_response>{% endfor -%}
{% endif -%}
{%- elif m.role == 'system' -%}
<|system|>
{{ visible_text(m.content) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    <|assistant|>{{- '\n<think></think>' if (enable_thinking is defined and not enable_thinking) else '' -}}
{%- endif -%}"#;

const ALTERNATE: &str = r#"{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"#;

const MISC: &str = r#"{% for m in messages %}
  {% if m.role == 'system' %}
    SYS: {{ m.content | trim }}
  {% else %}
    {{ loop.index }}/{{ loop.length }} {{ m.role | upper }}: {{ m.content }}
  {% endif %}
{% endfor %}
{% set parts = "a,b,,c".split(",") %}
parts={{ parts }} n={{ parts | length }} joined={{ parts | join("-") }}
{{ {"k": 1, "z": [1.5, 2.0, none, true, "x'y"]} }}
{{ flag }} {{ nothing }} {{ 3 }} {{ 2.50 }} {{ 1e20 }} {{ 0.00001 }}
{{ data | tojson }}
{{ data | tojson(indent=2) }}
{{ data | tojson(sort_keys=true, separators=(",", ":")) }}
{{ data | tojson(ensure_ascii=true) }}
{{ "  padded\n" | trim }}|{{ "xxhixx".strip("x") }}|{{ "Hello World".lower() }}|{{ "a b  c".split() }}
{% for k, v in data.items() %}{{ k }}={{ v }};{% endfor %}
{% if data.get("missing", "dflt") == "dflt" %}get-ok{% endif %} {{ data.keys() | list }}
{%- for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{% if i == 1 %}{% continue %}{% endif %} i{{ i }}{% endfor %}
{{ "x" ~ 1 }} {{ messages | selectattr("role", "equalto", "user") | map(attribute="content") | join("+") }}
{% if not add_generation_prompt %}end{% endif %}
"#;

#[test]
fn qwen3_plain() {
    let got = render(
        QWEN3,
        r#"[{"role": "system", "content": "You are Qwen."}, {"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "<think>\nLet me think.\n</think>\n\nHello! How can I help?"}, {"role": "user", "content": "What's 2+2?"}]"#,
        true,
        r#"{}"#,
    );
    let want = "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello! How can I help?<|im_end|>\n<|im_start|>user\nWhat's 2+2?<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(got, want);
}

#[test]
fn qwen3_no_thinking() {
    let got = render(
        QWEN3,
        r#"[{"role": "user", "content": "Hi!"}]"#,
        true,
        r#"{"enable_thinking": false}"#,
    );
    let want = "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    assert_eq!(got, want);
}

#[test]
fn qwen3_tools() {
    let got = render(
        QWEN3,
        r#"[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris and Tokyo?"}, {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}}, {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Tokyo\"}"}}]}, {"role": "tool", "content": "{\"temp\": 21.5}"}, {"role": "tool", "content": "{\"temp\": 18}"}, {"role": "assistant", "content": "<think>\nBoth fetched.\n</think>\n\nParis 21.5°C, Tokyo 18°C."}]"#,
        false,
        r#"{"tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get weather — «now»", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["°C", "°F"]}, "days": {"type": "integer", "default": 1, "minimum": 0.5}}, "required": ["city"]}}}]}"#,
    );
    let want = "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get weather — «now»\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"°C\", \"°F\"]}, \"days\": {\"type\": \"integer\", \"default\": 1, \"minimum\": 0.5}}, \"required\": [\"city\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris and Tokyo?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"°C\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Tokyo\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21.5}\n</tool_response>\n<tool_response>\n{\"temp\": 18}\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nBoth fetched.\n</think>\n\nParis 21.5°C, Tokyo 18°C.<|im_end|>\n";
    assert_eq!(got, want);
}

#[test]
fn deepseek_basic() {
    let got = render(
        DEEPSEEK,
        r#"[{"role": "system", "content": "You are helpful."}, {"role": "system", "content": "Second system."}, {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "<think>hmm</think>Hi there"}, {"role": "user", "content": "Bye"}]"#,
        true,
        r#"{}"#,
    );
    let want = "<s>You are helpful.\n\nSecond system.<｜User｜>Hello<｜Assistant｜>Hi there<｜end▁of▁sentence｜><｜User｜>Bye<｜Assistant｜></think>";
    assert_eq!(got, want);
}

#[test]
fn deepseek_thinking_tools() {
    let got = render(
        DEEPSEEK,
        r#"[{"role": "user", "content": "Add 2 and 3"}, {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}, {"type": "function", "function": {"name": "log", "arguments": "{}"}}]}, {"role": "tool", "content": "5"}, {"role": "tool", "content": "ok"}, {"role": "assistant", "content": "The sum is 5."}, {"role": "user", "content": "Thanks"}]"#,
        true,
        r#"{"thinking": true}"#,
    );
    let want = "<s><｜User｜>Add 2 and 3<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"a\": 2, \"b\": 3}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>log\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>5<｜tool▁output▁end｜><｜tool▁output▁begin｜>ok<｜tool▁output▁end｜><｜tool▁outputs▁end｜>The sum is 5.<｜end▁of▁sentence｜><｜User｜>Thanks<｜Assistant｜>";
    assert_eq!(got, want);
}

#[test]
fn glm_tools() {
    let got = render(
        GLM,
        r#"[{"role": "system", "content": "Sys prompt"}, {"role": "user", "content": [{"type": "text", "text": "What is the weather"}, {"type": "image"}, " in Paris?"]}, {"role": "assistant", "content": "<think>need tool</think>Checking.", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2, "opts": {"metric": true, "x": null}}}}]}, {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "It is sunny."}, {"role": "user", "content": "Thanks"}]"#,
        true,
        r#"{"enable_thinking": false, "tools": [{"name": "get_weather", "parameters": {"city": "string", "days": "int"}}]}"#,
    );
    let want = "[gMASK]<sop><|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"string\", \"days\": \"int\"}}\n</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n...\n</tool_call><|system|>\nSys prompt<|user|>\nWhat is the weather in Paris?/nothink<|assistant|>\n<think></think>\nChecking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{\"metric\": true, \"x\": null}</arg_value>\n</tool_call><|observation|>\n<tool_response>\nsunny\n</tool_response><|assistant|>\n<think></think>\nIt is sunny.<|user|>\nThanks/nothink<|assistant|>\n<think></think>";
    assert_eq!(got, want);
}

#[test]
fn glm_plain() {
    let got = render(
        GLM,
        r#"[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "More"}]"#,
        true,
        r#"{}"#,
    );
    let want =
        "[gMASK]<sop><|user|>\nHi<|assistant|>\n<think></think>\nHello<|user|>\nMore<|assistant|>";
    assert_eq!(got, want);
}

#[test]
fn alternate_ok() {
    let got = render(
        ALTERNATE,
        r#"[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]"#,
        false,
        r#"{}"#,
    );
    let want = "<s>[INST] a [/INST]b</s>[INST] c [/INST]";
    assert_eq!(got, want);
}

#[test]
fn misc() {
    let got = render(
        MISC,
        r#"[{"role": "system", "content": "  sys  "}, {"role": "user", "content": "u1"}, {"role": "assistant", "content": null}, {"role": "user", "content": "u2"}]"#,
        false,
        r#"{"flag": true, "nothing": null, "data": {"name": "Zoë", "n": 3, "f": 2.0, "big": 1e+17, "small": 0.0001, "list": [1, "two", null, false], "nested": {"b": [], "a": {}}, "q": "He said \"hi\"\n\ttab\\ \u0001  "}}"#,
    );
    let want = "    SYS: sys\n    2/4 USER: u1\n    3/4 ASSISTANT: \n    4/4 USER: u2\nparts=['a', 'b', '', 'c'] n=4 joined=a-b--c\n{'k': 1, 'z': [1.5, 2.0, None, True, \"x'y\"]}\nTrue None 3 2.5 1e+20 1e-05\n{\"name\": \"Zoë\", \"n\": 3, \"f\": 2.0, \"big\": 1e+17, \"small\": 0.0001, \"list\": [1, \"two\", null, false], \"nested\": {\"b\": [], \"a\": {}}, \"q\": \"He said \\\"hi\\\"\\n\\ttab\\\\ \\u0001 \u{2028}\"}\n{\n  \"name\": \"Zoë\",\n  \"n\": 3,\n  \"f\": 2.0,\n  \"big\": 1e+17,\n  \"small\": 0.0001,\n  \"list\": [\n    1,\n    \"two\",\n    null,\n    false\n  ],\n  \"nested\": {\n    \"b\": [],\n    \"a\": {}\n  },\n  \"q\": \"He said \\\"hi\\\"\\n\\ttab\\\\ \\u0001 \u{2028}\"\n}\n{\"big\":1e+17,\"f\":2.0,\"list\":[1,\"two\",null,false],\"n\":3,\"name\":\"Zoë\",\"nested\":{\"a\":{},\"b\":[]},\"q\":\"He said \\\"hi\\\"\\n\\ttab\\\\ \\u0001 \u{2028}\",\"small\":0.0001}\n{\"name\": \"Zo\\u00eb\", \"n\": 3, \"f\": 2.0, \"big\": 1e+17, \"small\": 0.0001, \"list\": [1, \"two\", null, false], \"nested\": {\"b\": [], \"a\": {}}, \"q\": \"He said \\\"hi\\\"\\n\\ttab\\\\ \\u0001 \\u2028\"}\npadded|hi|hello world|['a', 'b', 'c']\nname=Zoë;n=3;f=2.0;big=1e+17;small=0.0001;list=[1, 'two', None, False];nested={'b': [], 'a': {}};q=He said \"hi\"\n\ttab\\ \u{1} \u{2028};get-ok ['name', 'n', 'f', 'big', 'small', 'list', 'nested', 'q'] i0 i2x1 u1+u2\nend";
    assert_eq!(got, want);
}

#[test]
fn raise_exception_fails_the_render() {
    let t = ChatTemplate::new(ALTERNATE, "<s>", "</s>").unwrap();
    let messages: Vec<Value> = serde_json::from_str(
        r#"[{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]"#,
    )
    .unwrap();
    let err = t.render(&messages, false, &Map::new()).unwrap_err();
    assert!(matches!(err, TemplateError::Render(_)));
    assert!(
        err.to_string()
            .contains("Conversation roles must alternate user/assistant/user/assistant/..."),
        "{err}"
    );
}

#[test]
fn syntax_errors_are_reported_at_compile() {
    let err = ChatTemplate::new("{% for m in messages %}{{ m.content }", "", "").unwrap_err();
    assert!(matches!(err, TemplateError::Compile(_)), "{err}");
}

#[test]
fn strftime_now_formats_current_date() {
    let t = ChatTemplate::new(
        r#"{{ strftime_now("%Y-%m-%d") }}|{{ strftime_now("%d %b %Y") }}"#,
        "",
        "",
    )
    .unwrap();
    let out = t.render(&[], false, &Map::new()).unwrap();
    let (iso, human) = out.split_once('|').unwrap();
    assert_eq!(iso.len(), 10, "{out}");
    assert!(iso[..4].parse::<u32>().unwrap() >= 2024, "{out}");
    assert_eq!(human.len(), 11, "{out}");
}

#[test]
fn tokens_and_extra_kwargs_are_variables() {
    let t = ChatTemplate::new(
        "{{ bos_token }}{% if enable_thinking %}T{% endif %}{{ tools is none }}{{ custom }}{{ eos_token }}",
        "<B>",
        "<E>",
    )
    .unwrap();
    let mut extra = Map::new();
    extra.insert("enable_thinking".into(), Value::Bool(true));
    extra.insert("custom".into(), Value::String("c".into()));
    assert_eq!(t.render(&[], false, &extra).unwrap(), "<B>TTruec<E>");
}

#[test]
fn trailing_newline_of_template_is_dropped() {
    let t = ChatTemplate::new("x\n", "", "").unwrap();
    assert_eq!(t.render(&[], false, &Map::new()).unwrap(), "x");
    let t = ChatTemplate::new("x\n\n", "", "").unwrap();
    assert_eq!(t.render(&[], false, &Map::new()).unwrap(), "x\n");
}
