//! Finding and reading the chat template and special tokens of a checkpoint or export
//! (`chat_template.jinja`, `chat_template.json`, `tokenizer_config.json`), as transformers does.

use super::*;

/// Jinja `raise_exception(message)`, which transformers provides to templates.
pub(crate) fn raise_exception(message: String) -> Result<JinjaValue, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// minijinja's message plus the template line, when known.
pub(crate) fn describe_jinja_error(e: &minijinja::Error) -> String {
    match e.line() {
        Some(line) => format!("{e} (template line {line})"),
        None => e.to_string(),
    }
}

pub(crate) fn read_json_if_exists(path: &Path) -> Result<Option<Value>, PromptError> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| PromptError::Json {
                path: path.to_path_buf(),
                source,
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(PromptError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// A special token from `tokenizer_config.json`: a string, `{content: ...}`, or null/absent.
pub(crate) fn special_token(
    config: &Value,
    var: &str,
    path: &Path,
) -> Result<Option<String>, PromptError> {
    match config.get(var) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(PromptError::Field {
                path: path.to_path_buf(),
                field: format!("{var}.content"),
                problem: "expected a string".into(),
            }),
        },
        Some(other) => Err(PromptError::Field {
            path: path.to_path_buf(),
            field: var.into(),
            problem: format!("expected a string or an object with `content`, got {other}"),
        }),
    }
}

/// Returns the template text and a description of where it came from.
pub(crate) fn find_chat_template(
    dir: &Path,
    tokenizer_config: Option<&Value>,
) -> Result<(String, String), PromptError> {
    let jinja_path = dir.join(CHAT_TEMPLATE_FILE);
    match std::fs::read_to_string(&jinja_path) {
        Ok(text) => return Ok((text, jinja_path.display().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(PromptError::Io {
                path: jinja_path,
                source,
            })
        }
    }
    let json_path = dir.join(CHAT_TEMPLATE_JSON_FILE);
    if let Some(value) = read_json_if_exists(&json_path)? {
        if let Some(found) = template_field(&value, &json_path)? {
            return Ok(found);
        }
    }
    let config_path = dir.join(TOKENIZER_CONFIG_FILE);
    if let Some(config) = tokenizer_config {
        if let Some(found) = template_field(config, &config_path)? {
            return Ok(found);
        }
    }
    Err(PromptError::NoChatTemplate {
        dir: dir.to_path_buf(),
    })
}

/// Reads `chat_template` from a JSON object: a string or a list of `{name, template}`.
pub(crate) fn template_field(
    value: &Value,
    path: &Path,
) -> Result<Option<(String, String)>, PromptError> {
    let field_err = |field: &str, problem: String| PromptError::Field {
        path: path.to_path_buf(),
        field: field.to_string(),
        problem,
    };
    let source = |field: &str| format!("{} (field `{field}`)", path.display());
    match value.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some((s.clone(), source("chat_template")))),
        Some(Value::Array(items)) => {
            let mut names = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let name = item.get("name").and_then(Value::as_str).ok_or_else(|| {
                    field_err(
                        &format!("chat_template[{i}].name"),
                        "expected a string".into(),
                    )
                })?;
                if name == "default" {
                    let template =
                        item.get("template")
                            .and_then(Value::as_str)
                            .ok_or_else(|| {
                                field_err(
                                    &format!("chat_template[{i}].template"),
                                    "expected a string".into(),
                                )
                            })?;
                    return Ok(Some((
                        template.to_string(),
                        source(&format!("chat_template[{i}]")),
                    )));
                }
                names.push(name.to_string());
            }
            Err(field_err(
                "chat_template",
                format!("no template named \"default\" (found: {names:?})"),
            ))
        }
        Some(other) => Err(field_err(
            "chat_template",
            format!(
                "expected a string or a list of {{name, template}}, got {}",
                json_kind(other)
            ),
        )),
    }
}

pub(crate) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
