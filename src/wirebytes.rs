//! Bytes in JSON: a string when they are UTF-8, else `{"b64": "..."}`. File names, symlink
//! targets and file lines need not be UTF-8, and must survive a round trip exactly.

use serde::{Deserialize, Serialize};

/// Bytes on the wire: a JSON string when they are UTF-8, else `{"b64": "..."}`, so names that
/// are not UTF-8 survive the round trip exactly.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Debug)]
pub struct WireBytes(pub Vec<u8>);

impl Serialize for WireBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(&self.0) {
            Ok(text) => s.serialize_str(text),
            Err(_) => {
                use base64::Engine;
                use serde::ser::SerializeMap;
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry(
                    "b64",
                    &base64::engine::general_purpose::STANDARD.encode(&self.0),
                )?;
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for WireBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Text(String),
            B64 { b64: String },
        }
        match Form::deserialize(d)? {
            Form::Text(t) => Ok(WireBytes(t.into_bytes())),
            Form::B64 { b64 } => {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map(WireBytes)
                    .map_err(serde::de::Error::custom)
            }
        }
    }
}

/// `#[serde(with = "crate::wirebytes::lines")]` for a list of byte strings.
pub mod lines {
    use super::WireBytes;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(lines: &[Vec<u8>], s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(lines.len()))?;
        for line in lines {
            seq.serialize_element(&WireBytes(line.clone()))?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<u8>>, D::Error> {
        let v: Vec<WireBytes> = Vec::deserialize(d)?;
        Ok(v.into_iter().map(|w| w.0).collect())
    }
}
