//! Chat templates: the model's Jinja template rendered with `minijinja`, configured like
//! Hugging Face's `apply_chat_template` (trim/lstrip blocks, Python string methods,
//! `raise_exception`, `tojson` without HTML escaping, `strftime_now`).

use minijinja::{Environment, Error, ErrorKind, Value};
use serde::Serialize;

/// A message as templates see it, as Hugging Face's `apply_chat_template` passes OpenAI-style
/// messages: `role` and text `content`, and where present an assistant's `tool_calls`
/// (arguments as an object), a tool result's `tool_call_id` and `name`, and an assistant's
/// `reasoning_content`. Absent keys are undefined in the template, as in Python.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TemplateMessage {
    pub role: String,
    pub content: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<TemplateToolCall>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl TemplateMessage {
    /// A plain message.
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Self {
            role: role.to_string(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            reasoning_content: None,
        }
    }
}

/// An assistant's earlier call: `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TemplateToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: TemplateFunction,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TemplateFunction {
    pub name: String,
    /// An object where the call's arguments parse, else their text.
    pub arguments: serde_json::Value,
}

/// What a template is rendered with besides the messages.
#[derive(Debug, Clone, Default)]
pub struct RenderContext {
    /// `tools`, as `apply_chat_template(tools=...)` passes them (OpenAI's function tools).
    pub tools: Option<serde_json::Value>,
    pub add_generation_prompt: bool,
    /// Template switches (`enable_thinking`, `reasoning_effort`), passed as variables.
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

const NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the special tokens' text.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| format!("the model's chat template does not compile: {e:#}"))?;
        Ok(Self {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// Renders `messages`, ending with the assistant's turn opener when `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[TemplateMessage],
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        let ctx = RenderContext {
            add_generation_prompt,
            ..RenderContext::default()
        };
        self.render_with(messages, &ctx)
    }

    /// Renders `messages` with tools and template switches.
    pub fn render_with(
        &self,
        messages: &[TemplateMessage],
        ctx: &RenderContext,
    ) -> Result<String, String> {
        let template = self.env.get_template(NAME).map_err(|e| e.to_string())?;
        let mut vars: std::collections::BTreeMap<&str, Value> = ctx
            .kwargs
            .iter()
            .map(|(k, v)| (k.as_str(), Value::from_serialize(v)))
            .collect();
        vars.insert("messages", Value::from_serialize(messages));
        vars.insert(
            "add_generation_prompt",
            Value::from(ctx.add_generation_prompt),
        );
        vars.insert("bos_token", Value::from(self.bos_token.as_str()));
        vars.insert("eos_token", Value::from(self.eos_token.as_str()));
        if let Some(tools) = &ctx.tools {
            vars.insert("tools", Value::from_serialize(tools));
        }
        template.render(vars).map_err(|e| match e.kind() {
            ErrorKind::InvalidOperation => e.detail().unwrap_or("rejected").to_string(),
            _ => format!("the chat template failed: {e:#}"),
        })
    }
}

/// Templates call `raise_exception("...")` to refuse a conversation (e.g. bad role order).
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `tojson` as transformers defines it: `json.dumps(ensure_ascii=False)`, optional indent.
fn tojson(value: Value, indent: Option<usize>) -> Result<Value, Error> {
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let text = match indent {
        None => python_json(&json),
        Some(n) => {
            let mut out = Vec::new();
            let indent = " ".repeat(n);
            let fmt = serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes());
            let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
            json.serialize(&mut ser)
                .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
            String::from_utf8_lossy(&out).into_owned()
        }
    };
    Ok(Value::from_safe_string(text))
}

/// Python's `json.dumps` separators: `", "` and `": "`, keys in their order, no ASCII escaping.
pub fn python_json(v: &serde_json::Value) -> String {
    use serde_json::Value as J;
    match v {
        J::Array(items) => {
            let inner: Vec<String> = items.iter().map(python_json).collect();
            format!("[{}]", inner.join(", "))
        }
        J::Object(map) => {
            let inner: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", J::String(k.clone()), python_json(v)))
                .collect();
            format!("{{{}}}", inner.join(", "))
        }
        other => other.to_string(),
    }
}

/// `strftime_now(format)` (Llama 3.x templates print today's date), UTC.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime(&format, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// The subset of `strftime` chat templates use: %d %m %Y %y %B %b %H %M %S %%.
fn strftime(format: &str, unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let month_name = MONTHS[(month - 1) as usize];
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 → (year, month 1–12, day 1–31) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> TemplateMessage {
        TemplateMessage::new(role, content)
    }

    #[test]
    fn python_string_methods_and_raise_exception_work() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{% if m.role not in ['user','assistant'] %}\
             {{ raise_exception('bad role ' + m.role) }}{% endif %}\
             [{{ m.content.strip() }}|{{ m.role.startswith('us') }}]{% endfor %}\
             {{ messages | tojson }}",
            "<s>",
            "</s>",
        )
        .unwrap();
        let out = t.render(&[msg("user", "  hi  ")], true).unwrap();
        // Booleans print as Python prints them; keys keep their order, as in `json.dumps`.
        assert_eq!(
            out,
            "[hi|True][{\"role\": \"user\", \"content\": \"  hi  \"}]"
        );
        let err = t.render(&[msg("robot", "x")], true).unwrap_err();
        assert_eq!(err, "bad role robot");
    }

    #[test]
    fn tojson_does_not_escape_html_and_keeps_unicode() {
        let t = ChatTemplate::new("{{ messages[0].content | tojson }}", "", "").unwrap();
        assert_eq!(
            t.render(&[msg("user", "<a>&é")], false).unwrap(),
            "\"<a>&é\""
        );
    }

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-07-26 13:25:09 UTC
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S", 1_722_000_309),
            "26 Jul 2024 13:25:09"
        );
        assert_eq!(strftime("%B %d, %y %%", 0), "January 01, 70 %");
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }
}
