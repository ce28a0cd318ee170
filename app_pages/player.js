// The live pool's player (Streamlit custom component v2): plays both pools in the browser.
//
// It receives, once, every frame of both pools (kvsim.dashboard.playback.player_payload: tile
// colour codes of the first frame, then each frame's changed tiles, and the figures shown beside
// each pool), and draws a frame by patching one pixel per changed tile into an ImageData, so a
// frame costs the changed tiles, not the pool: 100k blocks play as fast as 100. Play, pause, step
// and the scrubber act at once, without a round trip to the server; the frame it stops on is
// sent back (state "frame") so the inspector and kernel pages open on the same moment.
//
// Layout of the payload: uint32 start frame, uint32 header length, JSON header, 8-byte aligned
// arrays at the header's offsets (see player_payload).

const CLASS_ORDER = ["token_states", "reservation", "internal_fragmentation",
                     "external_fragmentation", "cached", "free"];
const CODE_NAMES = ["free", "cached (evictable prefix)", "external fragmentation",
                    "internal fragmentation", "reservation", "shared prefix block"];
const SPEEDS = [2, 5, 10, 20, 30, 60];

function parse(data) {
  const bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const start = dv.getUint32(0, true);
  const headLen = dv.getUint32(4, true);
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + headLen)));
  const body = bytes.slice(8 + headLen).buffer;  // a fresh buffer: offsets are aligned in it
  const kinds = {uint8: Uint8Array, uint32: Uint32Array, float32: Float32Array,
                 float64: Float64Array};
  const arr = (e) => new kinds[e.dtype](body, e.offset, e.length);
  header.start_frame = Math.min(start, header.num_frames - 1);
  header.times = arr(header.times);
  for (const side of header.sides) {
    for (const k of ["first", "change_start", "change_tile", "change_code"]) side[k] = arr(side[k]);
    for (const k of Object.keys(side.figures)) side.figures[k] = arr(side.figures[k]);
  }
  return header;
}

function rgb(hex) {
  const v = parseInt(hex.slice(1), 16);
  return [(v >> 16) & 255, (v >> 8) & 255, v & 255];
}

function fmtTime(t) {
  if (t < 60) return `${t.toFixed(1)} s`;
  const m = Math.floor(t / 60);
  return `${m} min ${(t - 60 * m).toFixed(1).padStart(4, "0")} s`;
}

function el(tag, cls, parent, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}

export default function (component) {
  const { data, setStateValue, parentElement } = component;
  const h = parse(data);
  const palette = h.colors.map(rgb);
  // a rerun with new data mounts again: the last mount's player goes
  parentElement.querySelectorAll(".kv-player").forEach((old) => old.remove());
  const root = el("div", "kv-player", null);
  parentElement.appendChild(root);

  // ---- controls
  const bar = el("div", "kv-bar", root);
  const play = el("button", "kv-btn kv-primary", bar, "▶ Play");
  play.dataset.testid = "kv-play";
  const stepBtn = el("button", "kv-btn", bar, "Step +1");
  stepBtn.dataset.testid = "kv-step";
  const scrub = el("input", "kv-scrub", bar);
  Object.assign(scrub, { type: "range", min: 0, max: h.num_frames - 1, step: 1 });
  scrub.setAttribute("aria-label", "simulated time (frame)");
  const speedLabel = el("label", "kv-speed", bar, "frames/s ");
  const speed = el("select", "", speedLabel);
  for (const s of SPEEDS) {
    const o = el("option", "", speed, String(s));
    o.value = s;
    if (s === 10) o.selected = true;
  }
  const clock = el("div", "kv-clock", root);
  if (h.note) el("div", "kv-note", root, h.note);
  const legend = el("div", "kv-legend", root);
  const swatches = [[h.colors.slice(6), "request KV (colour = request)"], [[h.colors[5]], "shared prefix block"],
                    [[h.colors[4]], "reservation"], [[h.colors[3]], "internal frag."],
                    [[h.colors[2]], "external frag."], [[h.colors[1]], "cached (evictable)"],
                    [[h.colors[0]], "free"]];
  for (const [cols, label] of swatches) {
    const item = el("span", "kv-legend-item", legend);
    for (const c of cols.slice(0, 4)) el("span", "kv-swatch", item).style.background = c;
    el("span", "", item, " " + label);
  }

  // ---- one panel per side
  const sides = h.sides.map((side) => {
    const box = el("div", "kv-side", null);
    el("div", "kv-title", box, side.title);
    const metrics = el("div", "kv-metrics", box);
    const m = {};
    for (const [key, label] of [["kv_usage", "KV usage"], ["running", "running"],
                                 ["waiting", "waiting"], ["preemptions", "preemptions"]]) {
      const cell = el("div", "kv-metric", metrics);
      el("div", "kv-metric-label", cell, label);
      m[key] = el("div", "kv-metric-value", cell, "-");
      m[key].dataset.metric = key;
    }
    const done = el("div", "kv-done", box, "");
    const pool = el("canvas", "kv-pool", box);
    pool.width = side.cols;
    pool.height = side.rows;
    pool.style.aspectRatio = `${side.cols} / ${side.rows}`;
    const ctx = pool.getContext("2d");
    const image = ctx.createImageData(side.cols, side.rows);
    image.data.fill(255);  // white: the grid's cells past the last tile stay so
    const tip = el("div", "kv-tip", box, "");
    const strip = el("canvas", "kv-strip", box);
    strip.width = 600;
    strip.height = 90;
    const conc = el("canvas", "kv-strip", box);
    conc.width = 600;
    conc.height = 70;
    const codes = new Uint8Array(side.num_tiles);
    pool.addEventListener("mousemove", (ev) => {
      const r = pool.getBoundingClientRect();
      const col = Math.floor((ev.clientX - r.left) / r.width * side.cols);
      const row = Math.floor((ev.clientY - r.top) / r.height * side.rows);
      const tile = row * side.cols + col;
      if (tile < 0 || tile >= side.num_tiles) { tip.textContent = ""; return; }
      const c = codes[tile];
      const what = c < CODE_NAMES.length ? CODE_NAMES[c] : "request KV (colour = request)";
      const unit = side.cells_per_tile > 1 ? `tokens ${tile * side.cells_per_tile}-` +
        `${(tile + 1) * side.cells_per_tile - 1}` : `block ${tile}`;
      tip.textContent = `${unit}: ${what}`;
    });
    pool.addEventListener("mouseleave", () => { tip.textContent = ""; });
    return { side, box, m, done, ctx, image, codes, strip, conc, shown: -1 };
  });
  const row = el("div", "kv-sides", root);
  for (const s of sides) row.appendChild(s.box);
  root.dataset.frames = h.num_frames;
  root.dataset.draws = 0;

  function paint(s, tile, code) {
    const c = palette[code];
    const p = tile * 4;
    s.image.data[p] = c[0]; s.image.data[p + 1] = c[1]; s.image.data[p + 2] = c[2];
  }

  function setPool(s, frame) {
    const side = s.side;
    if (s.shown < 0 || frame < s.shown) {  // from the first frame (rewinding)
      s.codes.set(side.first);
      for (let t = 0; t < side.num_tiles; t++) paint(s, t, side.first[t]);
      s.shown = 0;
    }
    for (let f = s.shown + 1; f <= frame; f++) {  // replay the changes of each frame on the way
      for (let j = side.change_start[f]; j < side.change_start[f + 1]; j++) {
        const t = side.change_tile[j], code = side.change_code[j];
        s.codes[t] = code;
        paint(s, t, code);
      }
    }
    s.shown = frame;
    s.ctx.putImageData(s.image, 0, 0);
  }

  function drawStrip(s, frame) {
    const { strip, conc, side } = s;
    const end = h.times[h.num_frames - 1] || 1;
    const x = (f) => h.times[f] / end * strip.width;
    let g = strip.getContext("2d");
    g.clearRect(0, 0, strip.width, strip.height);
    let below = new Float32Array(frame + 1);
    for (const name of CLASS_ORDER) {  // stacked shares of the pool, bottom up
      const v = side.figures[name];
      g.beginPath();
      g.moveTo(x(0), strip.height * (1 - below[0]));
      for (let f = 0; f <= frame; f++) g.lineTo(x(f), strip.height * (1 - below[f] - v[f]));
      for (let f = frame; f >= 0; f--) g.lineTo(x(f), strip.height * (1 - below[f]));
      g.closePath();
      g.fillStyle = h.class_colors[name];
      g.fill();
      for (let f = 0; f <= frame; f++) below[f] += v[f];
    }
    g = conc.getContext("2d");
    g.clearRect(0, 0, conc.width, conc.height);
    const top = Math.max(1, ...h.sides.map((o) => Math.max(...o.figures.running, ...o.figures.waiting)));
    for (const [name, color] of [["waiting", "#FF7F0E"], ["running", "#1F77B4"]]) {
      const v = side.figures[name];
      g.beginPath();
      for (let f = 0; f <= frame; f++) {
        const y = conc.height - 2 - v[f] / top * (conc.height - 4);
        if (f === 0) g.moveTo(x(f), y); else g.lineTo(x(f), y);
      }
      g.strokeStyle = color;
      g.lineWidth = 2;
      g.stroke();
    }
    g.fillStyle = "#555";
    g.font = "11px sans-serif";
    g.fillText(`running (blue) / waiting (orange), max ${top}`, 4, 11);
  }

  let frame = h.start_frame, playing = false, timer = null, last = 0;
  function show(f) {
    frame = Math.max(0, Math.min(h.num_frames - 1, f));
    scrub.value = frame;
    const t = h.times[frame];
    clock.textContent = `t = ${fmtTime(t)} of ${fmtTime(h.times[h.num_frames - 1])}` +
      `  ·  frame ${frame + 1} / ${h.num_frames}`;
    for (const s of sides) {
      setPool(s, frame);
      const fig = s.side.figures;
      s.m.kv_usage.textContent = `${Math.round(100 * fig.kv_usage[frame])}%`;
      s.m.running.textContent = String(Math.round(fig.running[frame]));
      s.m.waiting.textContent = String(Math.round(fig.waiting[frame]));
      s.m.preemptions.textContent = String(Math.round(fig.preemptions[frame]));
      s.done.textContent = t >= s.side.end_s ? "(all requests done)" : "";
      drawStrip(s, frame);
    }
    root.dataset.frame = frame;
    root.dataset.draws = Number(root.dataset.draws) + 1;
  }

  function report() { setStateValue("frame", frame); }
  function stop() {
    playing = false;
    if (timer !== null) cancelAnimationFrame(timer);
    timer = null;
    play.textContent = "▶ Play";
    root.dataset.playing = "0";
  }
  function tick(now) {
    if (!playing) return;
    const period = 1000 / Number(speed.value);
    if (now - last >= period) {
      last = now - ((now - last) % period);
      if (frame >= h.num_frames - 1) { stop(); report(); return; }
      show(frame + 1);
    }
    timer = requestAnimationFrame(tick);
  }
  play.addEventListener("click", () => {
    if (playing) { stop(); report(); return; }  // pause: stops before the next frame
    if (frame >= h.num_frames - 1) show(0);     // play from the last frame: start again
    playing = true;
    play.textContent = "⏸ Pause";
    root.dataset.playing = "1";
    last = performance.now();
    timer = requestAnimationFrame(tick);
  });
  stepBtn.addEventListener("click", () => { stop(); show(frame + 1); report(); });
  scrub.addEventListener("input", () => { stop(); show(Number(scrub.value)); });
  scrub.addEventListener("change", report);
  show(frame);
  root.dataset.playing = "0";
  return () => { stop(); root.remove(); };
}
