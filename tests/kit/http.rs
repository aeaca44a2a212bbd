//! Blocking HTTP/1.1 for tests (one request per connection) and free ports.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use serde_json::Value;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Sends one request; returns the status and the JSON body (Null when not JSON).
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Value), String> {
    request_with(port, method, path, body, &[])
}

/// Like [`request`], with extra headers.
pub fn request_with(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> Result<(u16, Value), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(120))).ok();
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n{}\r\n",
        payload.len(),
        headers
            .iter()
            .map(|(k, v)| format!("{k}: {v}\r\n"))
            .collect::<String>()
    );
    s.write_all(head.as_bytes()).map_err(|e| e.to_string())?;
    s.write_all(payload.as_bytes()).map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status in {text:?}"))?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

/// How an SSE stream ended.
#[derive(Debug, Clone)]
pub struct StreamEnd {
    pub status: u16,
    /// `data:` chunks with content before the end.
    pub chunks: usize,
    pub done: bool,
    /// The `error` object of an error event.
    pub error: Option<Value>,
    pub finish_reason: Option<String>,
    /// The connection broke (no `[DONE]`, no error event).
    pub broken: bool,
}

/// Streams a chat completion; `on_chunk` runs after each content chunk (with the count).
pub fn stream_chat(port: u16, body: &Value, mut on_chunk: impl FnMut(usize)) -> StreamEnd {
    let mut end = StreamEnd {
        status: 0,
        chunks: 0,
        done: false,
        error: None,
        finish_reason: None,
        broken: false,
    };
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        end.broken = true;
        return end;
    };
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
    let payload = body.to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{payload}",
        payload.len()
    );
    if s.write_all(head.as_bytes()).is_err() {
        end.broken = true;
        return end;
    }
    let mut reader = std::io::BufReader::new(s);
    let mut line = String::new();
    use std::io::BufRead;
    while {
        line.clear();
        matches!(reader.read_line(&mut line), Ok(n) if n > 0)
    } {
        if end.status == 0 {
            end.status = line
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
        }
        let Some(data) = line.trim_end().strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            end.done = true;
            return end;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if v.get("error").is_some() {
            end.error = Some(v["error"].clone());
            return end;
        }
        if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
            end.finish_reason = Some(f.to_string());
        }
        if v["choices"][0]["delta"]["content"]
            .as_str()
            .is_some_and(|c| !c.is_empty())
        {
            end.chunks += 1;
            on_chunk(end.chunks);
        }
    }
    end.broken = true;
    end
}
