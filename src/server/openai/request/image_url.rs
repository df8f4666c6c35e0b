//! Where a request's images come from: `data:` URLs decoded here (while the body is parsed,
//! [`Url`]), `http(s)://` URLs kept for the fetcher, anything else refused; every error names
//! the request field it came from.

use crate::server::error::ApiError;
use base64::Engine as _;
use serde::de::{self, value::MapAccessDeserializer, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::fmt;

/// Where an image of a request comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageSource {
    /// Bytes from a `data:` URL; `param` names the field it came from.
    Data { bytes: Vec<u8>, param: String },
    /// An `http(s)://` URL (fetched only with `--allow-remote-images`).
    Remote { url: String, param: String },
}

/// Decodes a `data:` URL's payload (only base64 payloads are accepted); the error is the
/// reason as text, which the request's parser reports naming the field ([`Url`]).
pub(super) fn decode_data_url(url: &str) -> Result<Vec<u8>, String> {
    let rest = &url["data:".len()..];
    let Some((meta, payload)) = rest.split_once(',') else {
        return Err("data URL has no ',' before its payload".into());
    };
    if !meta.split(';').any(|p| p.eq_ignore_ascii_case("base64")) {
        return Err("data URL must be base64-encoded (data:image/png;base64,...)".into());
    }
    // Line breaks inside the payload are allowed; a copy without them is made only when there
    // are some (a payload can be tens of MB, and the request budget counts every copy).
    let cleaned: std::borrow::Cow<'_, [u8]> = if payload.bytes().any(|b| b.is_ascii_whitespace()) {
        payload
            .bytes()
            .filter(|b| !b.is_ascii_whitespace())
            .collect::<Vec<u8>>()
            .into()
    } else {
        payload.as_bytes().into()
    };
    base64::engine::general_purpose::STANDARD
        .decode(&cleaned)
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(&cleaned))
        .map_err(|e| format!("invalid base64 in data URL: {e}"))
}

/// Whether `url` is a `data:` URL (the scheme in any case).
fn is_data_url(url: &str) -> bool {
    url.get(..5)
        .is_some_and(|s| s.eq_ignore_ascii_case("data:"))
}

/// Where the image of `url`, the field `param`, comes from: a `data:` URL's bytes (decoded
/// while parsing), an `http(s)://` URL (kept), anything else refused.
pub fn image_source(url: Url, param: String) -> Result<ImageSource, ApiError> {
    let url = match url {
        Url::Data(bytes) => return Ok(ImageSource::Data { bytes, param }),
        Url::Other(url) => url,
    };
    let lower = url.get(..8).unwrap_or(&url).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        Ok(ImageSource::Remote { url, param })
    } else if lower.starts_with("file:") {
        Err(ApiError::bad(
            param,
            "file:// URLs are never read by the server",
        ))
    } else {
        Err(ApiError::bad(
            param,
            "image URL must be a data: URL (data:image/png;base64,...) or http(s)://",
        ))
    }
}

/// A part's `image_url`: `{"url": …, "detail": …}` (`detail` is ignored) or, as some
/// clients send it, the URL string itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImageUrl {
    pub url: Option<Url>,
}

/// An image URL as parsed. A `data:` URL's payload is decoded while the body is parsed,
/// straight from the body's bytes: its base64 text is never copied into a string of its own
/// (a payload can be tens of MB, and the body budget counts every copy,
/// [`crate::server::front::BODY_COPIES`]). A bad payload fails the parse, naming the field.
#[derive(Debug, Clone, PartialEq)]
pub enum Url {
    /// A `data:` URL's decoded bytes.
    Data(Vec<u8>),
    /// Any other URL, classified by [`image_source`].
    Other(String),
}

impl<'de> Deserialize<'de> for Url {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Url;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            // serde_json lends the string from the body when it has no escapes (a base64
            // payload has none), and from a scratch buffer otherwise.
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Url, E> {
                if is_data_url(s) {
                    decode_data_url(s).map(Url::Data).map_err(E::custom)
                } else {
                    Ok(Url::Other(s.to_string()))
                }
            }
        }
        d.deserialize_str(V)
    }
}

impl<'de> Deserialize<'de> for ImageUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Object {
            url: Option<Url>,
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ImageUrl;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object {\"url\": ...}")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<ImageUrl, E> {
                Url::deserialize(de::value::StrDeserializer::<E>::new(s))
                    .map(|u| ImageUrl { url: Some(u) })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ImageUrl, A::Error> {
                let o = Object::deserialize(MapAccessDeserializer::new(map))?;
                Ok(ImageUrl { url: o.url })
            }
        }
        d.deserialize_any(V)
    }
}
