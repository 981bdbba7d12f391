//! `solofs bench --plot FILE.png`: bar charts of ops/s and p50 latency per
//! phase and target, drawn into an RGB bitmap and written as PNG by the
//! `png` crate.

/// One target's values in a group: (ops/s, p50 µs).
pub type Pair = (Option<f64>, Option<f64>);

/// One bar group: a phase, and per target (ops/s, p50 µs).
pub struct Group {
    pub phase: String,
    pub values: Vec<Pair>,
}

const W: usize = 1000;
const H: usize = 620;
const COLORS: [[u8; 3]; 6] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
];

struct Canvas {
    px: Vec<u8>,
}

impl Canvas {
    fn new() -> Canvas {
        Canvas {
            px: vec![255; W * H * 3],
        }
    }
    fn rect(&mut self, x0: usize, y0: usize, x1: usize, y1: usize, c: [u8; 3]) {
        for y in y0.min(H)..y1.min(H) {
            for x in x0.min(W)..x1.min(W) {
                self.px[(y * W + x) * 3..(y * W + x) * 3 + 3].copy_from_slice(&c);
            }
        }
    }
    fn text(&mut self, mut x: usize, y: usize, s: &str, c: [u8; 3]) {
        for ch in s.chars() {
            let g = glyph(ch.to_ascii_lowercase());
            for (row, bits) in g.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) != 0 {
                        self.rect(x + col, y + row, x + col + 1, y + row + 1, c);
                    }
                }
            }
            x += 6;
        }
    }
}

/// 5x7 glyphs (rows top to bottom, bit 4 = leftmost column).
fn glyph(c: char) -> [u8; 7] {
    match c {
        '0' => [14, 17, 19, 21, 25, 17, 14],
        '1' => [4, 12, 4, 4, 4, 4, 14],
        '2' => [14, 17, 1, 2, 4, 8, 31],
        '3' => [31, 2, 4, 2, 1, 17, 14],
        '4' => [2, 6, 10, 18, 31, 2, 2],
        '5' => [31, 16, 30, 1, 1, 17, 14],
        '6' => [6, 8, 16, 30, 17, 17, 14],
        '7' => [31, 1, 2, 4, 8, 8, 8],
        '8' => [14, 17, 17, 14, 17, 17, 14],
        '9' => [14, 17, 17, 15, 1, 2, 12],
        'a' => [0, 0, 14, 1, 15, 17, 15],
        'b' => [16, 16, 22, 25, 17, 17, 30],
        'c' => [0, 0, 14, 16, 16, 17, 14],
        'd' => [1, 1, 13, 19, 17, 17, 15],
        'e' => [0, 0, 14, 17, 31, 16, 14],
        'f' => [6, 9, 8, 28, 8, 8, 8],
        'g' => [0, 15, 17, 17, 15, 1, 14],
        'h' => [16, 16, 22, 25, 17, 17, 17],
        'i' => [4, 0, 12, 4, 4, 4, 14],
        'j' => [2, 0, 6, 2, 2, 18, 12],
        'k' => [16, 16, 18, 20, 24, 20, 18],
        'l' => [12, 4, 4, 4, 4, 4, 14],
        'm' => [0, 0, 26, 21, 21, 17, 17],
        'n' => [0, 0, 22, 25, 17, 17, 17],
        'o' => [0, 0, 14, 17, 17, 17, 14],
        'p' => [0, 0, 30, 17, 30, 16, 16],
        'q' => [0, 0, 13, 19, 15, 1, 1],
        'r' => [0, 0, 22, 25, 16, 16, 16],
        's' => [0, 0, 14, 16, 14, 1, 30],
        't' => [8, 8, 28, 8, 8, 9, 6],
        'u' => [0, 0, 17, 17, 17, 19, 13],
        'v' => [0, 0, 17, 17, 17, 10, 4],
        'w' => [0, 0, 17, 17, 21, 21, 10],
        'x' => [0, 0, 17, 10, 4, 10, 17],
        'y' => [0, 0, 17, 17, 15, 1, 14],
        'z' => [0, 0, 31, 2, 4, 8, 31],
        '-' => [0, 0, 0, 31, 0, 0, 0],
        '.' => [0, 0, 0, 0, 0, 12, 12],
        ':' => [0, 12, 12, 0, 12, 12, 0],
        '/' => [0, 1, 2, 4, 8, 16, 0],
        '(' => [2, 4, 8, 8, 8, 4, 2],
        ')' => [8, 4, 2, 2, 2, 4, 8],
        ',' => [0, 0, 0, 0, 12, 4, 8],
        '_' => [0, 0, 0, 0, 0, 0, 31],
        '=' => [0, 0, 31, 0, 31, 0, 0],
        _ => [0; 7],
    }
}

fn fmt_si(v: f64) -> String {
    if v >= 1e6 {
        format!("{}m", v / 1e6)
    } else if v >= 1e3 {
        format!("{}k", v / 1e3)
    } else if v >= 1.0 {
        format!("{v}")
    } else {
        format!("{v:.1}")
    }
}

/// Draws one log-scale panel of bars (values per group per target).
fn panel(
    cv: &mut Canvas,
    top: usize,
    height: usize,
    title: &str,
    groups: &[Group],
    get: &dyn Fn(&Pair) -> Option<f64>,
) {
    let vals: Vec<f64> = groups
        .iter()
        .flat_map(|g| g.values.iter().filter_map(get))
        .filter(|v| *v > 0.0)
        .collect();
    cv.text(60, top, title, [0, 0, 0]);
    if vals.is_empty() {
        return;
    }
    let lo = vals
        .iter()
        .cloned()
        .fold(f64::MAX, f64::min)
        .log10()
        .floor();
    let hi = vals
        .iter()
        .cloned()
        .fold(0.0, f64::max)
        .log10()
        .ceil()
        .max(lo + 1.0);
    let (x0, x1, y0, y1) = (60usize, W - 20, top + 14, top + height - 24);
    let ypos = |v: f64| y1 - (((v.log10() - lo) / (hi - lo)) * (y1 - y0) as f64) as usize;
    for e in lo as i32..=hi as i32 {
        let v = 10f64.powi(e);
        let y = ypos(v);
        cv.rect(x0, y, x1, y + 1, [220, 220, 220]);
        cv.text(4, y.saturating_sub(3), &fmt_si(v), [80, 80, 80]);
    }
    cv.rect(x0, y0, x0 + 1, y1, [0, 0, 0]);
    cv.rect(x0, y1, x1, y1 + 1, [0, 0, 0]);
    let n = groups.len().max(1);
    let gw = (x1 - x0) / n;
    let targets = groups
        .iter()
        .map(|g| g.values.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let bw = (gw.saturating_sub(10) / targets).max(1);
    for (gi, g) in groups.iter().enumerate() {
        let gx = x0 + gi * gw + 5;
        for (ti, v) in g.values.iter().enumerate() {
            if let Some(v) = get(v).filter(|v| *v > 0.0) {
                let y = ypos(v.max(10f64.powf(lo)));
                cv.rect(
                    gx + ti * bw,
                    y,
                    gx + (ti + 1) * bw - 1,
                    y1,
                    COLORS[ti % COLORS.len()],
                );
            }
        }
        cv.text(gx, y1 + 6, &g.phase[..g.phase.len().min(gw / 6)], [0, 0, 0]);
    }
}

/// Renders the chart as PNG bytes.
pub fn render(
    title: &str,
    labels: &[String],
    groups: &[Group],
) -> Result<Vec<u8>, png::EncodingError> {
    let mut cv = Canvas::new();
    cv.text(10, 8, title, [0, 0, 0]);
    for (i, l) in labels.iter().enumerate() {
        let x = 10 + i * 330;
        cv.rect(x, 24, x + 10, 34, COLORS[i % COLORS.len()]);
        cv.text(x + 14, 26, &l[..l.len().min(50)], [0, 0, 0]);
    }
    panel(
        &mut cv,
        44,
        290,
        "operations per second (log scale)",
        groups,
        &|v| v.0,
    );
    panel(
        &mut cv,
        336,
        280,
        "p50 latency per call, microseconds (log scale)",
        groups,
        &|v| v.1,
    );
    png(W, H, &cv.px)
}

/// Encodes RGB pixels as PNG (the `png` crate).
pub fn png(w: usize, h: usize, rgb: &[u8]) -> Result<Vec<u8>, png::EncodingError> {
    let mut out = Vec::new();
    let mut e = png::Encoder::new(&mut out, w as u32, h as u32);
    e.set_color(png::ColorType::Rgb);
    e.set_depth(png::BitDepth::Eight);
    let mut wr = e.write_header()?;
    wr.write_image_data(rgb)?;
    wr.finish()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_decodes_to_its_pixels() {
        let px = [255, 0, 0, 0, 0, 255];
        let p = png(2, 1, &px).unwrap();
        let mut r = png::Decoder::new(std::io::Cursor::new(&p))
            .read_info()
            .unwrap();
        let mut buf = vec![0; r.output_buffer_size().unwrap()];
        let info = r.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (2, 1));
        assert_eq!(info.color_type, png::ColorType::Rgb);
        assert_eq!(&buf[..info.buffer_size()], &px);
        // A whole chart: the size asked, and the title's black pixels.
        let c = render("t", &["a".into()], &[]).unwrap();
        let mut r = png::Decoder::new(std::io::Cursor::new(&c))
            .read_info()
            .unwrap();
        let mut buf = vec![0; r.output_buffer_size().unwrap()];
        let info = r.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (W as u32, H as u32));
        assert!(buf.chunks(3).any(|p| p == [0, 0, 0]));
    }
}
