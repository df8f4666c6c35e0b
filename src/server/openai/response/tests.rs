//! The wire bytes of `src/server/openai/response.rs`, pinned: these strings are what the
//! server wrote when it built its bodies as `serde_json::json!` values.

use super::*;

fn candidate(id: u32, token: &str, logprob: f32) -> Candidate {
    Candidate {
        id,
        token: token.into(),
        logprob,
    }
}

/// A token with two alternatives (one of them impossible) and one without a log-probability.
fn tokens() -> Vec<TokenLogprobs> {
    vec![
        TokenLogprobs {
            chosen: candidate(0, "a\"b", -0.25),
            top: vec![
                candidate(1, "t1é", -0.1),
                candidate(2, "t2é", f32::NEG_INFINITY),
            ],
        },
        TokenLogprobs {
            chosen: candidate(3, "x", f32::NAN),
            top: vec![],
        },
    ]
}

fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap()
}

#[test]
fn completions_keep_their_bytes() {
    let choice = Choice::new(
        "hi".into(),
        "stop",
        Some("</s>".into()),
        Some(Logprobs::of(&tokens())),
    );
    let c = ChatCompletion::new("chatcmpl-1".into(), 7, "m".into(), choice, Usage::new(3, 4));
    assert_eq!(
        json(&c),
        r#"{"choices":[{"finish_reason":"stop","index":0,"logprobs":{"content":[{"bytes":[97,34,98],"logprob":-0.25,"token":"a\"b","top_logprobs":[{"bytes":[116,49,195,169],"logprob":-0.10000000149011612,"token":"t1é"},{"bytes":[116,50,195,169],"logprob":null,"token":"t2é"}]},{"bytes":[120],"logprob":null,"token":"x","top_logprobs":[]}]},"message":{"content":"hi","role":"assistant"},"stop_reason":"</s>"}],"created":7,"id":"chatcmpl-1","model":"m","object":"chat.completion","usage":{"completion_tokens":4,"prompt_tokens":3,"total_tokens":7}}"#
    );
    let choice = Choice::new("hi".into(), "length", None, None);
    let c = ChatCompletion::new("chatcmpl-1".into(), 7, "m".into(), choice, Usage::new(3, 4));
    assert_eq!(
        json(&c),
        r#"{"choices":[{"finish_reason":"length","index":0,"logprobs":null,"message":{"content":"hi","role":"assistant"},"stop_reason":null}],"created":7,"id":"chatcmpl-1","model":"m","object":"chat.completion","usage":{"completion_tokens":4,"prompt_tokens":3,"total_tokens":7}}"#
    );
}

#[test]
fn chunks_keep_their_bytes() {
    let head = ChunkHead {
        id: "c".into(),
        created: 7,
        model: "m".into(),
    };
    assert_eq!(
        json(&head.chunk(Delta::role(), None)),
        r#"{"choices":[{"delta":{"content":"","role":"assistant"},"finish_reason":null,"index":0,"logprobs":null}],"created":7,"id":"c","model":"m","object":"chat.completion.chunk"}"#
    );
    let one = Logprobs::of(&tokens()[..1]);
    assert_eq!(
        json(&head.chunk(Delta::content("x"), Some(one))),
        r#"{"choices":[{"delta":{"content":"x"},"finish_reason":null,"index":0,"logprobs":{"content":[{"bytes":[97,34,98],"logprob":-0.25,"token":"a\"b","top_logprobs":[{"bytes":[116,49,195,169],"logprob":-0.10000000149011612,"token":"t1é"},{"bytes":[116,50,195,169],"logprob":null,"token":"t2é"}]}]}}],"created":7,"id":"c","model":"m","object":"chat.completion.chunk"}"#
    );
    assert_eq!(
        json(&head.chunk(Delta::content("x"), None)),
        r#"{"choices":[{"delta":{"content":"x"},"finish_reason":null,"index":0,"logprobs":null}],"created":7,"id":"c","model":"m","object":"chat.completion.chunk"}"#
    );
    assert_eq!(
        json(&head.last("stop", Usage::new(1, 2))),
        r#"{"choices":[{"delta":{},"finish_reason":"stop","index":0,"logprobs":null}],"created":7,"id":"c","model":"m","object":"chat.completion.chunk","usage":{"completion_tokens":2,"prompt_tokens":1,"total_tokens":3}}"#
    );
}

#[test]
fn the_model_list_keeps_its_bytes() {
    assert_eq!(
        json(&ModelList::one("lightonocr", 5, 4096)),
        r#"{"data":[{"created":5,"id":"lightonocr","max_model_len":4096,"object":"model","owned_by":"ocrctl"}],"object":"list"}"#
    );
}
