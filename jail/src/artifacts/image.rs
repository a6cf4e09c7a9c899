//! Image headers: the pixel size of PNG, GIF and JPEG files, and the size
//! an SVG's root element declares. Nothing is decoded: a header promising
//! 2^31 x 2^31 pixels costs what the header does.
//!
//! PNG and GIF sizes are fixed offsets in the first chunk. JPEG segments are
//! walked in the kept prefix (at most 4 MiB), each step moving forward, so
//! the walk is bounded by the prefix. The SVG reader follows at most
//! [`MAX_XML_DEPTH`] levels to the root element and checks the file's
//! deadline every 256 events; past either it stops and says so.

use quick_xml::events::Event;

use super::budget::{Deadline, Ticker, MAX_XML_DEPTH};
use crate::result::Summary;

pub(super) fn png_size(head: &[u8]) -> Option<Summary> {
    // Signature (8), IHDR length and type (8), then width and height.
    if head.len() < 24 || &head[12..16] != b"IHDR" {
        return None;
    }
    let be = |i: usize| u32::from_be_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    Some(Summary::Image { width: be(16), height: be(20) })
}

pub(super) fn gif_size(head: &[u8]) -> Option<Summary> {
    if head.len() < 10 {
        return None;
    }
    let le = |i: usize| u16::from_le_bytes([head[i], head[i + 1]]) as u32;
    Some(Summary::Image { width: le(6), height: le(8) })
}

/// Walk the JPEG segments to the first start-of-frame marker.
pub(super) fn jpeg_size(data: &[u8]) -> Option<Summary> {
    let mut i = 2;
    while i + 4 <= data.len() {
        if data[i] != 0xff {
            return None;
        }
        let marker = data[i + 1];
        if marker == 0xff {
            i += 1;
            continue;
        }
        if matches!(marker, 0xd8 | 0x01 | 0xd0..=0xd7) {
            i += 2;
            continue;
        }
        let len = u16::from_be_bytes([data[i + 2], data[i + 3]]) as usize;
        let sof = matches!(marker, 0xc0..=0xcf) && !matches!(marker, 0xc4 | 0xc8 | 0xcc);
        if sof {
            if i + 9 > data.len() {
                return None;
            }
            let height = u16::from_be_bytes([data[i + 5], data[i + 6]]) as u32;
            let width = u16::from_be_bytes([data[i + 7], data[i + 8]]) as u32;
            return Some(Summary::Image { width, height });
        }
        if len < 2 {
            return None;
        }
        i += 2 + len;
    }
    None
}

/// Why the SVG reader stopped before the root element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SvgCut {
    Depth,
    Time,
}

/// The root `<svg>` element's size: width/height when unitless or in px,
/// else its viewBox; with why the reader stopped short, if it did.
pub(super) fn svg_size(data: &[u8], deadline: Deadline) -> (Summary, Option<SvgCut>) {
    let none = Summary::Svg { width: None, height: None };
    let mut reader = quick_xml::Reader::from_reader(data);
    let mut buf = Vec::new();
    let mut ticker = Ticker::new(deadline);
    let mut depth = 0usize;
    loop {
        if ticker.tick() {
            return (none, Some(SvgCut::Time));
        }
        buf.clear();
        let e = match reader.read_event_into(&mut buf) {
            Ok(Event::Start(e)) => {
                depth += 1;
                if depth > MAX_XML_DEPTH {
                    return (none, Some(SvgCut::Depth));
                }
                e
            }
            Ok(Event::Empty(e)) => e,
            Ok(Event::End(_)) => {
                depth = depth.saturating_sub(1);
                continue;
            }
            Ok(Event::Eof) | Err(_) => return (none, None),
            Ok(_) => continue,
        };
        let name = e.name();
        let local = name.as_ref().rsplit(':').next().unwrap_or("");
        if local != "svg" {
            continue;
        }
        let get = |key: &str| {
            e.try_get_attribute(key)
                .ok()
                .flatten()
                .and_then(|a| a.normalized_value(quick_xml::XmlVersion::Implicit1_0).ok().map(|v| v.into_owned()))
        };
        let px = |v: Option<String>| {
            v.and_then(|v| v.trim().trim_end_matches("px").trim().parse::<f64>().ok()).filter(|n| n.is_finite())
        };
        let mut width = px(get("width"));
        let mut height = px(get("height"));
        if let Some(vb) = get("viewBox") {
            let n: Vec<f64> = vb
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|s| !s.is_empty())
                .take(5)
                .filter_map(|s| s.parse().ok())
                .collect();
            if n.len() == 4 && n[2].is_finite() && n[3].is_finite() {
                width = width.or(Some(n[2]));
                height = height.or(Some(n[3]));
            }
        }
        return (Summary::Svg { width, height }, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn image_sizes_come_from_their_headers() {
        let mut png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
        png.extend_from_slice(&640u32.to_be_bytes());
        png.extend_from_slice(&480u32.to_be_bytes());
        assert_eq!(png_size(&png), Some(Summary::Image { width: 640, height: 480 }));
        let gif = b"GIF89a\x0a\x00\x05\x00";
        assert_eq!(gif_size(gif), Some(Summary::Image { width: 10, height: 5 }));
        // SOI, an APP0 segment of 16 bytes, then SOF0 with height 2, width 3.
        let mut jpg = vec![0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10];
        jpg.extend_from_slice(&[0; 14]);
        jpg.extend_from_slice(&[0xff, 0xc0, 0x00, 0x11, 0x08, 0x00, 0x02, 0x00, 0x03]);
        assert_eq!(jpeg_size(&jpg), Some(Summary::Image { width: 3, height: 2 }));
        let svg = |t: &[u8]| svg_size(t, Deadline::from_now());
        assert_eq!(svg(b"<svg width=\"40px\" height=\"30\"/>"), (Summary::Svg { width: Some(40.0), height: Some(30.0) }, None));
        assert_eq!(svg(b"<svg viewBox=\"0 0 8 6\"/>"), (Summary::Svg { width: Some(8.0), height: Some(6.0) }, None));
    }

    #[test]
    fn an_svg_root_behind_deep_nesting_or_past_the_deadline_is_not_searched_for() {
        let none = Summary::Svg { width: None, height: None };
        let deep = [
            b"<!-- <svg> -->".to_vec(),
            b"<g>".repeat(MAX_XML_DEPTH + 1),
            b"<svg width='1'/>".to_vec(),
        ]
        .concat();
        assert_eq!(svg_size(&deep, Deadline::from_now()), (none.clone(), Some(SvgCut::Depth)));
        let shallow = [b"<g>".repeat(MAX_XML_DEPTH - 1), b"<svg width='1'/>".to_vec()].concat();
        assert_eq!(svg_size(&shallow, Deadline::from_now()).1, None);
        let wide = [b"<g/>".repeat(1000), b"<svg width='1'/>".to_vec()].concat();
        assert_eq!(svg_size(&wide, Deadline::at(Instant::now())), (none, Some(SvgCut::Time)));
    }
}
