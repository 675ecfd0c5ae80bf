// swama playground: decisions, chat, models and live metrics, all through the server's own API.
"use strict";

const KEY_STORE = "swama.apiKey";
const HISTORY_STORE = "swama.decisions.history";
const HISTORY_SIZE = 20;
const MAX_IMAGES = 4;
const LABEL_MASS_HEADER = "X-Swama-Label-Mass";
const TEXT_KINDS = ["language", "vision"];
const TOP_LOGPROBS = 5;
const CHAT_STORE = { logprobs: "swama.chat.logprobs", format: "swama.chat.format", schema: "swama.chat.schema" };
// The decision form's adjustment controls: each is sent as this top-level field unless it is "none".
const ADJUSTMENTS = { x_debias: "#d-debias", x_calibration: "#d-calibration" };
const ADJUSTMENT_STORE = { x_debias: "swama.decisions.debias", x_calibration: "swama.decisions.calibration" };

const $ = (selector, root = document) => root.querySelector(selector);
const $$ = (selector, root = document) => Array.from(root.querySelectorAll(selector));

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

const state = {
  key: localStorage.getItem(KEY_STORE) || "",
  models: [],
  loaded: [],
  defaultModel: null,
  decisionImages: [],
  chatImages: [],
  chat: [],
  last: null, // the last decision run: {body, response, masses, latencyMs}
};

// ---- API ------------------------------------------------------------------------------------

class ApiFailure extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// The message exactly as the server worded it, whichever envelope the route uses.
function serverMessage(body) {
  if (!body || typeof body !== "object") return null;
  if (typeof body.error === "string") return body.error;
  if (body.error && typeof body.error.message === "string") return body.error.message;
  if (Array.isArray(body.errors) && body.errors.length && typeof body.errors[0].message === "string") {
    return body.errors[0].message;
  }
  if (typeof body.message === "string") return body.message;
  return null;
}

async function failure(response) {
  const text = await response.text();
  let message = text || response.statusText;
  try {
    message = serverMessage(JSON.parse(text)) ?? message;
  } catch (_) { /* not JSON: show the text itself */ }
  return new ApiFailure(response.status, message);
}

function authHeaders(extra = {}) {
  const headers = { ...extra };
  if (state.key) headers.Authorization = `Bearer ${state.key}`;
  return headers;
}

async function api(path, { body, signal } = {}) {
  const init = { headers: authHeaders(), signal };
  if (body !== undefined) {
    init.method = "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiFailure(0, `The server could not be reached (${error.message}).`);
  }
  if (!response.ok) throw await failure(response);
  return response;
}

function showError(box, error) {
  box.replaceChildren();
  if (!error) {
    box.hidden = true;
    return;
  }
  const status = error.status ? `HTTP ${error.status}` : "Error";
  box.append(el("span", { class: "status", text: status }), el("span", { class: "message", text: error.message }));
  box.hidden = false;
  if (error.status === 401) $("#api-key").focus();
}

// ---- tabs, key, models ------------------------------------------------------------------------

function selectTab(name) {
  for (const tab of $$(".tab")) tab.setAttribute("aria-selected", String(tab.dataset.tab === name));
  for (const panel of $$(".panel")) panel.hidden = panel.id !== `panel-${name}`;
  if (name === "server") {
    refreshServer();
    refreshBatches();
  }
}

function showKeyState() {
  $("#key-state").textContent = state.key ? "key set" : "";
}

async function loadModels() {
  try {
    const [models, health] = await Promise.all([api("/v1/models").then((r) => r.json()), fetchHealth()]);
    state.models = models.data;
    state.defaultModel = health && health.default_model;
    showError($("#banner"), null);
  } catch (error) {
    state.models = [];
    showError($("#banner"), error);
  }
  fillModelSelect($("#d-model"), "swama.decisions.model");
  fillModelSelect($("#c-model"), "swama.chat.model");
  renderModelTable();
  updateImageZones();
}

async function fetchHealth() {
  const response = await fetch("/health", { headers: authHeaders() });
  if (!response.ok) return null;
  const health = await response.json();
  state.loaded = health.models_loaded || [];
  return health;
}

function fillModelSelect(select, store) {
  const usable = state.models.filter((m) => TEXT_KINDS.includes(m.kind));
  const wanted = select.value || localStorage.getItem(store) || state.defaultModel;
  select.replaceChildren(...usable.map((m) => el("option", { value: m.id, text: `${m.id} (${m.kind})` })));
  if (usable.some((m) => m.id === wanted)) select.value = wanted;
  if (!usable.length) select.append(el("option", { value: "", text: "no chat model installed" }));
}

function modelKind(id) {
  const model = state.models.find((m) => m.id === id);
  return model ? model.kind : null;
}

// ---- images -----------------------------------------------------------------------------------

function readDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

function imageZone(drop, input, thumbs, list) {
  const render = () => {
    thumbs.replaceChildren(...list.map((url, i) => el("figure", {},
      el("img", { src: url, alt: `image ${i + 1}` }),
      el("button", { type: "button", title: "remove", text: "\u00d7", onclick: () => { list.splice(i, 1); render(); } }))));
  };
  const add = async (files) => {
    for (const file of files) {
      if (list.length >= MAX_IMAGES) break;
      list.push(await readDataUrl(file));
    }
    render();
  };
  input.addEventListener("change", () => { add(Array.from(input.files)); input.value = ""; });
  drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    add(Array.from(event.dataTransfer.files).filter((f) => f.type.startsWith("image/")));
  });
  return render;
}

function updateImageZones() {
  $("#d-drop").hidden = modelKind($("#d-model").value) !== "vision";
  $("#c-drop").hidden = modelKind($("#c-model").value) !== "vision";
}

// ---- decisions: the form ----------------------------------------------------------------------

const OPTION_FIELDS = {
  choice: { list: "choices", value: "value", placeholder: "value" },
  score: { list: "levels", value: "label", placeholder: "level label" },
};

function optionRow(type, value = "", description = "") {
  const row = el("div", { class: "option-row" },
    el("input", { class: "value", placeholder: OPTION_FIELDS[type].placeholder, value }),
    el("input", { class: "description", placeholder: "description (optional)", value: description }),
    el("button", { type: "button", class: "small", title: "remove option", text: "\u00d7",
      onclick: () => row.remove() }));
  return row;
}

function addQuestion(question) {
  const type = question.type;
  const node = el("div", { class: "question", "data-type": type },
    el("div", { class: "head" },
      el("span", { class: "kind", text: type }),
      el("input", { class: "name", placeholder: "name (optional)", value: question.name ?? "" }),
      el("button", { type: "button", class: "small remove", text: "remove", onclick: () => node.remove() })),
    el("input", { class: "instructions", placeholder: "instructions, e.g. Is this a billing issue?",
      value: question.instructions ?? "" }));
  if (type in OPTION_FIELDS) {
    const fields = OPTION_FIELDS[type];
    const options = el("div", { class: "options" });
    for (const option of question[fields.list] || []) {
      options.append(optionRow(type, String(option[fields.value]), option.description ?? ""));
    }
    node.append(options, el("button", { type: "button", class: "small add-option",
      text: type === "choice" ? "+ choice" : "+ level", onclick: () => options.append(optionRow(type)) }));
  }
  $("#d-questions").append(node);
  return node;
}

const STARTER_QUESTIONS = [
  { type: "predicate", name: "billing", instructions: "Is this a billing issue?" },
  { type: "choice", name: "team", instructions: "Which team should handle this?",
    choices: [{ value: "billing" }, { value: "technical" }, { value: "sales" }] },
  { type: "score", name: "urgency", instructions: "How urgent is it?",
    levels: [{ label: "low" }, { label: "medium" }, { label: "high", description: "needs action today" }] },
];

// The request exactly as the form describes it; key order follows the API reference.
function decisionBody() {
  const text = $("#d-input").value;
  const images = modelKind($("#d-model").value) === "vision" ? state.decisionImages : [];
  const input = images.length
    ? [{ role: "user", content: [{ type: "input_text", text },
      ...images.map((url) => ({ type: "input_image", image_url: url }))] }]
    : text;
  const questions = $$("#d-questions .question").map((node) => {
    const type = node.dataset.type;
    const question = { type };
    const name = $(".name", node).value.trim();
    if (name) question.name = name;
    question.instructions = $(".instructions", node).value;
    if (type in OPTION_FIELDS) {
      const fields = OPTION_FIELDS[type];
      question[fields.list] = $$(".option-row", node).map((row) => {
        const option = { [fields.value]: $(".value", row).value };
        const description = $(".description", row).value;
        if (description) option.description = description;
        return option;
      });
    }
    return question;
  });
  return { model: $("#d-model").value, input, questions, ...adjustmentFields() };
}

// The adjustments the controls ask for; "none" is left out, so the plain request stays as it was.
function adjustmentFields() {
  const fields = {};
  for (const [field, selector] of Object.entries(ADJUSTMENTS)) {
    if ($(selector).value !== "none") fields[field] = $(selector).value;
  }
  return fields;
}

function loadForm(body) {
  if ([...$("#d-model").options].some((o) => o.value === body.model)) $("#d-model").value = body.model;
  if (typeof body.input === "string") {
    $("#d-input").value = body.input;
  } else {
    const parts = body.input.flatMap((m) => (typeof m.content === "string" ? [{ type: "input_text", text: m.content }] : m.content));
    $("#d-input").value = parts.filter((p) => p.type === "input_text").map((p) => p.text).join("\n");
  }
  $("#d-questions").replaceChildren();
  for (const question of body.questions) addQuestion(question);
  for (const [field, selector] of Object.entries(ADJUSTMENTS)) $(selector).value = body[field] ?? "none";
  updateImageZones();
}

// ---- decisions: running and showing -----------------------------------------------------------

async function runDecision(event) {
  event.preventDefault();
  const body = decisionBody();
  const button = $("#d-run");
  button.disabled = true;
  $("#d-status").textContent = "scoring\u2026";
  showError($("#d-error"), null);
  const started = performance.now();
  try {
    const response = await api("/v1/decisions", { body });
    const result = await response.json();
    const latencyMs = performance.now() - started;
    const masses = (response.headers.get(LABEL_MASS_HEADER) || "").split(",").map((v) => (v === "null" || v === "" ? null : Number(v)));
    state.last = { body, response: result, masses, latencyMs };
    showDecision(state.last);
    remember(state.last);
    $("#d-status").textContent = "";
  } catch (error) {
    $("#d-status").textContent = "";
    showError($("#d-error"), error);
  } finally {
    button.disabled = false;
  }
}

function fmt(value, digits = 4) {
  return value === null || value === undefined ? "\u2013" : Number(value).toFixed(digits);
}

// One row per option in request order: [label, probability].
function optionsOf(answer) {
  if (answer.type === "predicate") return [["yes", answer.probability], ["no", 1 - answer.probability]];
  if (answer.type === "choice") return answer.probabilities.map((p) => [String(p.value), p.probability]);
  return answer.probabilities.map((p) => [`${p.value} \u00b7 ${p.label}`, p.probability]);
}

// One bar per option; the winner is the first maximum.
function optionBars(options) {
  let winner = 0;
  options.forEach(([, p], i) => { if (p > options[winner][1]) winner = i; });
  return options.map(([label, p], i) => {
    const bar = el("div", { class: "bar" });
    bar.style.width = `${(p * 100).toFixed(4)}%`;
    return el("div", { class: i === winner ? "option winner" : "option", "data-probability": String(p), title: `${label}: ${p}` },
      el("span", { class: "label", text: label }),
      el("div", { class: "track" }, bar),
      el("span", { class: "pct", text: `${(p * 100).toFixed(1)}%` }));
  });
}

function fmtList(values, digits = 3) {
  return `[${values.map((v) => fmt(v, digits)).join(", ")}]`;
}

// The adjusted reading's name: the methods that took effect, "unchanged" when none did.
function adjustmentName(adjustment) {
  const applied = [adjustment.debias, adjustment.calibration].filter((m) => m && m !== "none");
  return applied.length ? applied.join(" + ") : "unchanged";
}

// What was applied to one answer, in words: the methods (and what was asked, where that differs),
// the orders scored, the prior and where it came from, the content-free reading, the temperature.
function adjustmentLine(adjustment, body) {
  const parts = [];
  const method = (kind, field) => {
    const asked = (body && body[field]) || "none";
    const applied = adjustment[kind] ?? "none";
    if (asked === "none" && applied === "none") return null;
    return `${kind} ${applied}${asked !== applied ? ` (${asked} asked)` : ""}`;
  };
  const debias = method("debias", "x_debias");
  const orders = adjustment.orders ?? 1;
  if (debias) parts.push(`${debias}, ${orders} order${orders === 1 ? "" : "s"} scored`);
  if (Array.isArray(adjustment.prior) || adjustment.prior_source) {
    const source = { file: "from the calibration file", estimated: "estimated", estimating: "still estimating" }[adjustment.prior_source]
      ?? adjustment.prior_source;
    const n = adjustment.prior_questions;
    const from = [source, n != null ? `${n} question${n === 1 ? "" : "s"}` : null].filter(Boolean);
    const values = Array.isArray(adjustment.prior) ? ` ${fmtList(adjustment.prior)}` : "";
    parts.push(`prior${values}${from.length ? ` (${from.join(", ")})` : ""}`);
  }
  const calibration = method("calibration", "x_calibration");
  if (calibration) parts.push(calibration);
  if (Array.isArray(adjustment.content_free)) parts.push(`content-free reading ${fmtList(adjustment.content_free)}`);
  if (adjustment.temperature != null) parts.push(`temperature ${fmt(adjustment.temperature, 3)}`);
  return `applied: ${parts.join(" \u00b7 ")}`;
}

// The plain reading beside the adjusted one (the answer's own probabilities), both in request order.
function adjustedBars(options, adjustment, body) {
  const plain = options.map(([label], i) => [label, adjustment.raw_probabilities[i]]);
  const reading = (name, kind, rows) => el("div", { class: `reading ${kind}`, "data-reading": kind },
    el("div", { class: "reading-name", text: name }), ...optionBars(rows));
  return [
    el("div", { class: "adjustment muted", text: adjustmentLine(adjustment, body) }),
    el("div", { class: "readings" }, reading("plain", "plain", plain), reading(adjustmentName(adjustment), "adjusted", options)),
  ];
}

function answerCard(answer, question, mass, body) {
  const options = optionsOf(answer);
  const facts = [];
  if (answer.type === "predicate") facts.push(`probability ${fmt(answer.probability)}`);
  if (answer.type === "choice") facts.push(`choice ${JSON.stringify(answer.choice)}`);
  if (answer.type === "score") facts.push(`score ${fmt(answer.score, 3)} (expected level)`);
  if (answer.confidence !== undefined) facts.push(`confidence ${fmt(answer.confidence)}`);
  facts.push(`label mass ${fmt(mass)}`);
  return el("div", { class: "answer", "data-type": answer.type, "data-name": answer.name ?? "" },
    el("div", { class: "title" },
      el("span", { class: "name", text: answer.name ?? "(unnamed)" }),
      el("span", { class: "kind", text: answer.type }),
      el("span", { class: "muted", text: question ? question.instructions : "" })),
    el("div", { class: "facts", text: facts.join(" \u00b7 "),
      title: "label mass: the options' share of the model's whole next-token distribution; a low value means "
        + "the model would rather answer something else. Confidence is concentration, not correctness." }),
    ...(answer.x_adjustment ? adjustedBars(options, answer.x_adjustment, body) : optionBars(options)));
}

function showDecision(run) {
  const { body, response, masses, latencyMs } = run;
  $("#d-summary").textContent = `${response.model} \u00b7 ${response.usage.input_tokens} input tokens \u00b7 `
    + `${Math.round(latencyMs)} ms \u00b7 ${response.answers.length} answer${response.answers.length === 1 ? "" : "s"}`;
  $("#d-answers").replaceChildren(...response.answers.map((a, i) => answerCard(a, body.questions[i], masses[i] ?? null, body)));
  $("#d-copy").hidden = false;
  $("#d-snippet").textContent = "";
  $("#d-copied").textContent = "";
}

// ---- history (the browser's local storage) ----------------------------------------------------

function history() {
  try {
    return JSON.parse(localStorage.getItem(HISTORY_STORE) || "[]");
  } catch (_) {
    return [];
  }
}

function remember(run) {
  // Images stay out of storage (a few of them would fill it); the entry says how many there were.
  const images = typeof run.body.input === "string" ? 0 : run.body.input[0].content.filter((p) => p.type === "input_image").length;
  const body = images ? { ...run.body, input: run.body.input[0].content.find((p) => p.type === "input_text").text } : run.body;
  const entry = { at: new Date().toISOString(), body, images, response: run.response, masses: run.masses, latencyMs: run.latencyMs };
  const entries = [entry, ...history()].slice(0, HISTORY_SIZE);
  while (entries.length) {
    try {
      localStorage.setItem(HISTORY_STORE, JSON.stringify(entries));
      break;
    } catch (_) {
      entries.pop(); // over the storage quota: drop the oldest
    }
  }
  renderHistory();
}

function renderHistory() {
  const entries = history();
  $("#d-history").replaceChildren(...entries.map((entry) => {
    const input = typeof entry.body.input === "string" ? entry.body.input : "";
    const label = `${new Date(entry.at).toLocaleTimeString()} \u00b7 ${entry.body.model} \u00b7 `
      + `${entry.body.questions.length} q \u00b7 ${input.slice(0, 48)}${input.length > 48 ? "\u2026" : ""}`
      + Object.keys(ADJUSTMENTS).filter((f) => f in entry.body).map((f) => ` \u00b7 ${entry.body[f]}`).join("")
      + (entry.images ? ` (+${entry.images} image${entry.images === 1 ? "" : "s"}, not kept)` : "");
    return el("li", {}, el("button", { type: "button", text: label, onclick: () => {
      loadForm(entry.body);
      state.last = entry;
      showDecision(entry);
    } }));
  }));
}

// ---- "copy as" --------------------------------------------------------------------------------

function shellQuote(text) {
  return `'${text.replaceAll("'", "'\\''")}'`;
}

function py(value, indent = 0) {
  const pad = " ".repeat(indent + 4);
  const end = " ".repeat(indent);
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : JSON.stringify(value);
  if (typeof value === "string") return JSON.stringify(value);
  if (Array.isArray(value)) {
    if (!value.length) return "[]";
    return `[\n${value.map((v) => pad + py(v, indent + 4)).join(",\n")},\n${end}]`;
  }
  const entries = Object.entries(value);
  if (!entries.length) return "{}";
  return `{\n${entries.map(([k, v]) => `${pad}${JSON.stringify(k)}: ${py(v, indent + 4)}`).join(",\n")},\n${end}}`;
}

function curlSnippet(body) {
  const lines = [`curl ${shellQuote(`${location.origin}/v1/decisions`)}`, `  -H 'Content-Type: application/json'`];
  if (state.key) lines.push(`  -H "Authorization: Bearer $SWAMA_API_KEY"`);
  lines.push(`  -d ${shellQuote(JSON.stringify(body))}`);
  return lines.join(" \\\n");
}

function pythonKey() {
  return state.key ? `os.environ["SWAMA_API_KEY"]` : `"local"`;
}

// The adjustments are swama's own fields: the SDKs send them through extra_body.
function extraBody(body, indent) {
  const fields = Object.fromEntries(Object.keys(ADJUSTMENTS).filter((f) => f in body).map((f) => [f, body[f]]));
  return Object.keys(fields).length ? [`${" ".repeat(indent)}extra_body=${py(fields, indent)},`] : [];
}

function openaiSnippet(body) {
  return [
    ...(state.key ? ["import os", ""] : []),
    "from openai import OpenAI",
    "",
    `client = OpenAI(base_url=${JSON.stringify(`${location.origin}/v1`)}, api_key=${pythonKey()})`,
    "decision = client.decisions.create(",
    `    model=${py(body.model, 4)},`,
    `    input=${py(body.input, 4)},`,
    `    questions=${py(body.questions, 4)},`,
    ...extraBody(body, 4),
    ")",
    "print(decision.model_dump_json(indent=2))",
    "",
  ].join("\n");
}

// The same questions on /v1/systemone, which renders the same prompts: a predicate is a noul, a choice
// maps each value to its description, a score lists its levels as "label: description".
function typesafeQuestion(question) {
  const instructions = `instructions=${JSON.stringify(question.instructions)}`;
  if (question.type === "predicate") return `Noul(${instructions})`;
  if (question.type === "choice") {
    const criteria = question.choices.map((c) => `${JSON.stringify(String(c.value))}: ${c.description === undefined ? "None" : JSON.stringify(c.description)}`);
    return `Choice(${instructions}, criteria={${criteria.join(", ")}})`;
  }
  const levels = question.levels.map((l) => JSON.stringify(l.description ? `${l.label}: ${l.description}` : l.label));
  return `Score(${instructions}, criteria=[${levels.join(", ")}])`;
}

function typesafeSnippet(body) {
  const used = new Set(body.questions.map((q) => q.name).filter(Boolean));
  let n = 0;
  const names = body.questions.map((q) => {
    if (q.name) return q.name;
    let name;
    do { name = `q${++n}`; } while (used.has(name));
    used.add(name);
    return name;
  });
  const images = typeof body.input === "string" ? 0 : body.input[0].content.filter((p) => p.type === "input_image").length;
  const text = typeof body.input === "string" ? body.input : body.input[0].content.find((p) => p.type === "input_text").text;
  return [
    "import json",
    ...(state.key ? ["import os"] : []),
    "",
    "from typesafe_sdk import Choice, Noul, Score, TypeSafeClient",
    "",
    ...(images ? [`# The ${images} image(s) are not included: this SDK sends images as assets referenced from the state.`] : []),
    `with TypeSafeClient(base_url=${JSON.stringify(location.origin)}, api_key=${pythonKey()}, model=${JSON.stringify(body.model)}) as client:`,
    "    result = client.system_one(",
    `        state=${JSON.stringify(text)},`,
    "        questions={",
    ...body.questions.map((q, i) => `            ${JSON.stringify(names[i])}: ${typesafeQuestion(q)},`),
    "        },",
    ...extraBody(body, 8),
    "    )",
    "print(json.dumps(result.raw_http_response.json()[\"answers\"], indent=2))",
    "",
  ].join("\n");
}

const SNIPPETS = { curl: curlSnippet, openai: openaiSnippet, typesafe: typesafeSnippet };

async function copySnippet(kind) {
  if (!state.last) return;
  const text = SNIPPETS[kind](state.last.body);
  $("#d-snippet").textContent = text;
  $("#d-snippet").dataset.kind = kind;
  let copied = false;
  try {
    await navigator.clipboard.writeText(text);
    copied = true;
  } catch (_) {
    // No clipboard permission (or not a secure context): select the text so Ctrl+C copies it.
    const range = document.createRange();
    range.selectNodeContents($("#d-snippet"));
    getSelection().removeAllRanges();
    getSelection().addRange(range);
  }
  $("#d-copied").textContent = copied ? "copied to the clipboard" : "selected: press Ctrl+C to copy";
}

// ---- chat -------------------------------------------------------------------------------------

let chatAbort = null;

class SchemaError extends Error {}

// The JSON schema box, parsed; a SchemaError says what is wrong in words.
function parseSchema(text) {
  if (!text.trim()) throw new SchemaError("The JSON schema is empty: write one, or pick another response format.");
  let schema;
  try {
    schema = JSON.parse(text);
  } catch (error) {
    throw new SchemaError(`The JSON schema is not valid JSON: ${error.message}`);
  }
  if (schema === null || typeof schema !== "object" || Array.isArray(schema)) {
    throw new SchemaError("The JSON schema must be a JSON object, such as {\"type\": \"object\", \"properties\": {...}}.");
  }
  return schema;
}

// What the chat controls add to a request, in the OpenAI wire format; throws a SchemaError.
function chatOptions() {
  const options = {};
  if ($("#c-logprobs").checked) {
    options.logprobs = true;
    options.top_logprobs = TOP_LOGPROBS;
  }
  const format = $("#c-format").value;
  if (format === "json_object") options.response_format = { type: "json_object" };
  if (format === "json_schema") {
    options.response_format = {
      type: "json_schema", json_schema: { name: "playground", schema: parseSchema($("#c-schema").value), strict: true },
    };
  }
  return options;
}

function checkSchema() {
  const box = $("#c-schema-error");
  if ($("#c-format").value !== "json_schema") {
    box.hidden = true;
    return true;
  }
  try {
    parseSchema($("#c-schema").value);
    box.hidden = true;
    $("#c-schema").removeAttribute("aria-invalid");
    return true;
  } catch (error) {
    box.textContent = error.message;
    box.hidden = false;
    $("#c-schema").setAttribute("aria-invalid", "true");
    return false;
  }
}

function showChatControls() {
  $("#c-legend").hidden = !$("#c-logprobs").checked;
  $("#c-schema-box").hidden = $("#c-format").value !== "json_schema";
  checkSchema();
}

// ---- chat: tokens drawn by probability --------------------------------------------------------

const tokenData = new WeakMap(); // a token's span -> the logprobs entries it shows (more than one: a character split across tokens)

function percent(p) {
  if (p >= 0.9995) return "100%";
  if (p < 0.0005) return "<0.1%";
  return `${(p * 100).toFixed(1)}%`;
}

// Red for unlikely, through yellow, to green for likely.
function probabilityColour(p) {
  return `hsl(${Math.round(120 * Math.min(1, Math.max(0, p)))}, 80%, 84%)`;
}

// A token as the tooltip shows it: spaces, tabs and new lines made visible.
function visibleToken(token) {
  if (token === "") return "(empty)";
  return token.replaceAll(" ", "\u2423").replaceAll("\n", "\u21b5").replaceAll("\t", "\u21e5").replaceAll("\r", "\u240d");
}

// Streams one reply into `container`: text that comes with logprobs becomes one span per token,
// text without them stays plain. The text (delta.content) is what is shown; a token's own text only
// says which part of it is that token's. Tokens the text does not contain (cut by a stop sequence,
// say) are not drawn.
function replyView(container) {
  const decoder = new TextDecoder();
  let text = ""; // text received that no token has claimed yet
  let pending = []; // tokens received whose text has not arrived yet: {piece, entries}
  let partial = []; // entries whose bytes do not end a character yet: they join the next token
  let first = true;

  const plain = (piece) => {
    if (!piece) return;
    const last = container.lastChild;
    if (last && last.nodeType === Node.TEXT_NODE) last.appendData(piece);
    else container.append(piece);
  };
  const token = (piece, entries) => {
    const logprob = entries.reduce((sum, e) => sum + e.logprob, 0);
    const p = Math.exp(logprob);
    const span = el("span", { class: "tok", tabindex: first ? "0" : "-1", "data-logprob": String(logprob),
      "data-p": String(p), text: piece });
    span.style.backgroundColor = probabilityColour(p);
    tokenData.set(span, entries);
    container.append(span);
    first = false;
  };
  const align = () => {
    while (pending.length && text) {
      const { piece, entries } = pending[0];
      if (text.startsWith(piece)) {
        token(piece, entries);
        text = text.slice(piece.length);
        pending.shift();
      } else if (piece.startsWith(text)) {
        break; // the rest of this token's text comes with a later chunk
      } else {
        const at = text.indexOf(piece);
        if (at > 0) {
          plain(text.slice(0, at));
          text = text.slice(at);
        } else {
          pending.shift();
        }
      }
    }
  };
  return {
    add(content, entries) {
      for (const entry of entries || []) {
        const piece = Array.isArray(entry.bytes) ? decoder.decode(new Uint8Array(entry.bytes), { stream: true }) : entry.token;
        partial.push(entry);
        if (piece) {
          pending.push({ piece, entries: partial });
          partial = [];
        }
      }
      text += content || "";
      align();
      // Text that came without any logprobs is shown at once, as before.
      if (!(entries && entries.length) && !pending.length) {
        plain(text);
        text = "";
      }
    },
    finish() {
      plain(text);
      text = "";
      pending = [];
      partial = [];
    },
  };
}

let tipTimer = null;

function showTip(span) {
  const entries = tokenData.get(span);
  if (!entries) return;
  const tip = $("#c-tip");
  clearTimeout(tipTimer);
  const sections = entries.map((entry) => {
    const chosen = Math.exp(entry.logprob);
    const rows = (entry.top_logprobs || []).map((alt) => el("tr", { class: alt.token === entry.token ? "chosen" : null },
      el("td", {}, el("code", { text: visibleToken(alt.token) })),
      el("td", { class: "num", text: percent(Math.exp(alt.logprob)) })));
    return el("div", { class: "tip-token" },
      el("div", { class: "tip-head" }, el("code", { text: visibleToken(entry.token) }), ` ${percent(chosen)}`,
        el("span", { class: "muted", text: ` logprob ${entry.logprob.toFixed(3)}` })),
      rows.length
        ? el("table", {}, el("caption", { text: "top alternatives" }), el("tbody", {}, ...rows))
        : el("div", { class: "muted", text: "no alternatives sent" }));
  });
  tip.replaceChildren(...sections);
  tip.hidden = false;
  for (const other of $$(".tok[aria-describedby]")) other.removeAttribute("aria-describedby");
  span.setAttribute("aria-describedby", "c-tip");
  const box = span.getBoundingClientRect();
  const width = tip.offsetWidth;
  const height = tip.offsetHeight;
  let top = box.bottom + 4;
  if (top + height > window.innerHeight - 4 && box.top - height - 4 >= 4) top = box.top - height - 4;
  tip.style.top = `${Math.round(top)}px`;
  tip.style.left = `${Math.round(Math.max(4, Math.min(box.left, window.innerWidth - width - 4)))}px`;
}

function hideTip(delay = 0) {
  clearTimeout(tipTimer);
  const hide = () => {
    $("#c-tip").hidden = true;
    for (const span of $$(".tok[aria-describedby]")) span.removeAttribute("aria-describedby");
  };
  if (delay) tipTimer = setTimeout(hide, delay);
  else hide();
}

// One tab stop per reply; the arrow keys, Home and End move between its tokens; Escape hides the tip.
function tokenKeys(event) {
  const span = event.target;
  if (!span.classList || !span.classList.contains("tok")) return;
  if (event.key === "Escape") {
    hideTip();
    return;
  }
  const tokens = $$(".tok", span.parentNode);
  const at = tokens.indexOf(span);
  const to = { ArrowRight: at + 1, ArrowDown: at + 1, ArrowLeft: at - 1, ArrowUp: at - 1, Home: 0, End: tokens.length - 1 }[event.key];
  if (to === undefined) return;
  event.preventDefault();
  const next = tokens[Math.max(0, Math.min(tokens.length - 1, to))];
  span.setAttribute("tabindex", "-1");
  next.setAttribute("tabindex", "0");
  next.focus();
}

function watchTokens(log) {
  log.addEventListener("mouseover", (event) => { if (event.target.classList.contains("tok")) showTip(event.target); });
  log.addEventListener("mouseout", (event) => { if (event.target.classList.contains("tok")) hideTip(200); });
  log.addEventListener("focusin", (event) => { if (event.target.classList.contains("tok")) showTip(event.target); });
  log.addEventListener("focusout", (event) => { if (event.target.classList.contains("tok")) hideTip(); });
  log.addEventListener("keydown", tokenKeys);
  log.addEventListener("scroll", () => hideTip());
  // The tip stays while the pointer is on it, so its text can be read and selected.
  $("#c-tip").addEventListener("mouseenter", () => clearTimeout(tipTimer));
  $("#c-tip").addEventListener("mouseleave", () => hideTip(200));
  document.addEventListener("keydown", (event) => { if (event.key === "Escape") hideTip(); });
}

// An answer that is a JSON object or array is shown pretty-printed; "raw" shows it as it came.
function showJson(reply, content) {
  let value;
  try {
    value = JSON.parse(content);
  } catch (_) {
    return;
  }
  if (value === null || typeof value !== "object") return;
  const raw = $(".text", reply);
  const pretty = el("pre", { class: "json", text: JSON.stringify(value, null, 2) });
  const toggle = el("button", { type: "button", class: "small view", "aria-pressed": "false", text: "raw",
    title: "show the answer as the model wrote it" });
  toggle.addEventListener("click", () => {
    const showRaw = toggle.getAttribute("aria-pressed") !== "true";
    toggle.setAttribute("aria-pressed", String(showRaw));
    raw.hidden = !showRaw;
    pretty.hidden = showRaw;
  });
  raw.hidden = true;
  reply.prepend(el("div", { class: "msg-tools" }, el("span", { class: "muted", text: "JSON" }), toggle));
  raw.after(pretty);
}

function chatBubble(role, text, images = []) {
  const node = el("div", { class: `msg ${role}` }, el("span", { class: "text", text }));
  for (const url of images) node.append(el("img", { src: url, alt: "attached image" }));
  $("#c-log").append(node);
  $("#c-log").scrollTop = $("#c-log").scrollHeight;
  return node;
}

function chatMessages() {
  const messages = [];
  const system = $("#c-system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  return messages.concat(state.chat);
}

// Server-sent events: yields each JSON payload of a `data:` line until [DONE].
async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

async function sendChat(event) {
  event.preventDefault();
  const text = $("#c-input").value;
  if (!text.trim() && !state.chatImages.length) return;
  let options;
  try {
    options = chatOptions();
  } catch (error) {
    if (!(error instanceof SchemaError)) throw error;
    checkSchema();
    $("#c-schema").focus();
    return;
  }
  const images = modelKind($("#c-model").value) === "vision" ? state.chatImages.splice(0) : [];
  renderChatThumbs();
  const content = images.length
    ? [{ type: "text", text }, ...images.map((url) => ({ type: "image_url", image_url: { url } }))]
    : text;
  state.chat.push({ role: "user", content });
  const asked = chatBubble("user", text, images);
  $("#c-input").value = "";
  const reply = chatBubble("assistant", "");
  const view = replyView($(".text", reply));
  let answer = "";
  showError($("#c-error"), null);
  $("#c-send").disabled = true;
  $("#c-stop").disabled = false;
  chatAbort = new AbortController();
  const started = performance.now();
  let first = null;
  let pieces = 0;
  let usage = null;
  try {
    const body = {
      model: $("#c-model").value, messages: chatMessages(), stream: true, stream_options: { include_usage: true },
      max_tokens: Number($("#c-max").value) || 256, temperature: Number($("#c-temp").value), ...options,
    };
    const response = await api("/v1/chat/completions", { body, signal: chatAbort.signal });
    for await (const chunk of sseEvents(response)) {
      if (chunk.error) throw new ApiFailure(0, serverMessage(chunk) ?? JSON.stringify(chunk.error));
      if (chunk.usage) usage = chunk.usage;
      const choice = chunk.choices && chunk.choices[0];
      const delta = choice && choice.delta;
      const tokens = choice && choice.logprobs && Array.isArray(choice.logprobs.content) ? choice.logprobs.content : null;
      if ((delta && delta.content) || (tokens && tokens.length)) {
        const content = (delta && delta.content) || "";
        if (content) {
          if (first === null) first = performance.now();
          pieces += 1;
          answer += content;
        }
        view.add(content, tokens);
        $("#c-log").scrollTop = $("#c-log").scrollHeight;
        showChatStats(started, first, performance.now(), pieces, usage);
      }
    }
    view.finish();
    showJson(reply, answer);
    state.chat.push({ role: "assistant", content: answer });
    showChatStats(started, first, performance.now(), pieces, usage);
  } catch (error) {
    // The turn did not happen: its message goes back into the box, the history stays as it was.
    state.chat.pop();
    hideTip();
    asked.remove();
    reply.remove();
    $("#c-input").value = text;
    state.chatImages.push(...images);
    renderChatThumbs();
    if (error.name !== "AbortError") showError($("#c-error"), error);
    else $("#c-stats").textContent = "stopped";
  } finally {
    chatAbort = null;
    $("#c-send").disabled = false;
    $("#c-stop").disabled = true;
  }
}

function showChatStats(started, first, now, pieces, usage) {
  const tokens = usage ? usage.completion_tokens : pieces;
  const decodeSeconds = first === null ? 0 : (now - first) / 1000;
  // The first token comes with the prefill; the rate counts the tokens after it.
  const rate = decodeSeconds > 0 && tokens > 1 ? (tokens - 1) / decodeSeconds : null;
  const parts = [`${tokens} tokens`, rate === null ? "\u2013 tok/s" : `${rate.toFixed(1)} tok/s`];
  if (first !== null) parts.push(`first token ${Math.round(first - started)} ms`);
  if (usage) {
    const cached = (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0;
    parts.push(`prompt ${usage.prompt_tokens} tokens`, `cached ${cached}`);
  }
  // Speculative decoding: each decode step gives one token plus the drafted ones it accepts.
  const drafted = usage ? usage.accepted_draft_tokens || 0 : 0;
  const steps = usage ? usage.completion_tokens - drafted : 0;
  const perStep = drafted > 0 && steps > 0 ? usage.completion_tokens / steps : null;
  if (perStep !== null) parts.push(`${perStep.toFixed(1)} tokens/step (${drafted} drafted tokens accepted)`);
  $("#c-stats").textContent = parts.join(" \u00b7 ");
  $("#c-stats").dataset.rate = rate === null ? "" : String(rate);
  $("#c-stats").dataset.tokensPerStep = perStep === null ? "" : String(perStep);
  $("#c-stats").dataset.cached = usage ? String((usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0) : "";
}

let renderChatThumbs = () => {};

// ---- models and server ------------------------------------------------------------------------

function size(bytes) {
  if (!bytes && bytes !== 0) return "\u2013";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let value = bytes;
  while (value >= 1024 && i < units.length - 1) { value /= 1024; i += 1; }
  return `${value.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function renderModelTable() {
  $("#m-table tbody").replaceChildren(...state.models.map((m) => el("tr", { "data-model": m.id },
    el("td", { text: m.id }), el("td", { text: m.kind }), el("td", { class: "num", text: size(m.size_in_bytes) }),
    el("td", { class: "loaded", text: state.loaded.includes(m.id) ? "yes" : "no" }))));
}

// Prometheus text: the sum over every label set of each sample name.
function parseMetrics(text) {
  const totals = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)/);
    if (!match) continue;
    totals[match[1]] = (totals[match[1]] || 0) + Number(match[3]);
  }
  return totals;
}

let previous = null;

async function refreshServer() {
  let metrics;
  let health;
  try {
    const response = await fetch("/metrics", { headers: authHeaders() });
    if (!response.ok) throw await failure(response);
    metrics = parseMetrics(await response.text());
    health = await fetchHealth();
  } catch (error) {
    showError($("#banner"), error);
    return;
  }
  const now = performance.now();
  const rate = (name) => (previous && now > previous.at
    ? Math.max(0, ((metrics[name] || 0) - (previous.metrics[name] || 0)) / ((now - previous.at) / 1000)) : null);
  const rows = [
    ["Queue depth", metrics.swama_queue_waiting ?? 0, "queue"],
    ["Running rows", metrics.swama_running ?? 0, "running"],
    ["Models loaded", metrics.swama_models_loaded ?? 0, "loaded"],
    ["Generated tok/s", rate("swama_generated_tokens_total"), "generated-rate"],
    ["Prompt tok/s", rate("swama_prompt_tokens_total"), "prompt-rate"],
    ["Generated tokens", metrics.swama_generated_tokens_total ?? 0, "generated"],
    ["Prompt tokens from the cache", metrics.swama_prompt_cache_hit_tokens_total ?? 0, "cache-hits"],
    ["Drafted tokens accepted", metrics.swama_accepted_draft_tokens_total ?? 0, "draft-accepted"],
    ["Decision questions", metrics.swama_decision_questions_total ?? 0, "questions"],
    ["Requests", metrics.swama_requests_total ?? 0, "requests"],
    ["Version", health ? health.version : "\u2013", "version"],
    ["BLAS", health ? health.blas : "\u2013", "blas"],
  ];
  previous = { at: now, metrics };
  $("#s-stats").replaceChildren(...rows.flatMap(([label, value, id]) => [
    el("dt", { text: label }),
    el("dd", { "data-stat": id, text: value === null ? "\u2013" : id.endsWith("-rate") ? value.toFixed(1) : String(value) }),
  ]));
  renderModelTable();
}

// Batch jobs not yet over, with their progress. None, or an error (a server without the Batch API,
// a key it refuses), shows nothing: the server view above already reports an unreachable server.
const BATCH_ACTIVE = ["validating", "in_progress", "finalizing", "cancelling"];
let batchesBusy = false;

async function refreshBatches() {
  if (batchesBusy) return; // the last reading is still on its way
  batchesBusy = true;
  let active = [];
  try {
    const response = await fetch("/v1/batches?limit=100", { headers: authHeaders(), signal: AbortSignal.timeout(10000) });
    const list = response.ok ? await response.json() : null;
    if (list && Array.isArray(list.data)) active = list.data.filter((b) => b && BATCH_ACTIVE.includes(b.status));
  } catch (_) {
    /* unreachable, too slow, or not JSON: nothing to show */
  } finally {
    batchesBusy = false;
  }
  renderBatches(active);
}

// Lines answered or failed, of the total.
function batchProgress(batch) {
  const counts = batch.request_counts || {};
  const total = Number(counts.total) || 0;
  const failed = Number(counts.failed) || 0;
  const done = (Number(counts.completed) || 0) + failed;
  const share = total ? Math.min(1, done / total) : 0;
  const text = `${done}/${total}${total ? ` (${Math.floor(share * 100)}%)` : ""}${failed ? `, ${failed} failed` : ""}`;
  const bar = el("div", { class: "bar" });
  bar.style.width = `${(share * 100).toFixed(2)}%`;
  return el("div", { class: "progress", "data-share": String(share), title: text },
    el("div", { class: "track" }, bar), el("span", { class: "count", text }));
}

function renderBatches(batches) {
  $("#b-card").hidden = !batches.length;
  $("#b-table tbody").replaceChildren(...batches.map((b) => el("tr", { "data-batch": b.id },
    el("td", { text: b.id }), el("td", { text: b.model || "\u2013" }), el("td", { text: b.endpoint || "\u2013" }),
    el("td", { class: "status", text: b.status }), el("td", {}, batchProgress(b)))));
}

// ---- start ------------------------------------------------------------------------------------

function start() {
  $("#api-key").value = state.key;
  showKeyState();
  $("#key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.key = $("#api-key").value.trim();
    if (state.key) localStorage.setItem(KEY_STORE, state.key);
    else localStorage.removeItem(KEY_STORE);
    showKeyState();
    loadModels();
  });
  for (const tab of $$(".tab")) tab.addEventListener("click", () => selectTab(tab.dataset.tab));
  for (const button of $$("button.add")) button.addEventListener("click", () => {
    const type = button.dataset.add;
    const fields = OPTION_FIELDS[type];
    addQuestion(fields ? { type, [fields.list]: [{ [fields.value]: "" }, { [fields.value]: "" }] } : { type });
  });
  for (const button of $$("button.copy")) button.addEventListener("click", () => copySnippet(button.dataset.snippet));
  for (const question of STARTER_QUESTIONS) addQuestion(question);
  $("#decision-form").addEventListener("submit", runDecision);
  $("#d-history-clear").addEventListener("click", () => { localStorage.removeItem(HISTORY_STORE); renderHistory(); });
  for (const [field, selector] of Object.entries(ADJUSTMENTS)) {
    const select = $(selector);
    if ([...select.options].some((o) => o.value === localStorage.getItem(ADJUSTMENT_STORE[field]))) {
      select.value = localStorage.getItem(ADJUSTMENT_STORE[field]);
    }
    select.addEventListener("change", () => localStorage.setItem(ADJUSTMENT_STORE[field], select.value));
  }
  $("#d-model").addEventListener("change", () => { localStorage.setItem("swama.decisions.model", $("#d-model").value); updateImageZones(); });
  $("#c-model").addEventListener("change", () => { localStorage.setItem("swama.chat.model", $("#c-model").value); updateImageZones(); });
  imageZone($("#d-drop"), $("#d-files"), $("#d-thumbs"), state.decisionImages);
  renderChatThumbs = imageZone($("#c-drop"), $("#c-files"), $("#c-thumbs"), state.chatImages);
  $("#c-form").addEventListener("submit", sendChat);
  $("#c-input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("#c-form").requestSubmit();
    }
  });
  $("#c-stop").addEventListener("click", () => chatAbort && chatAbort.abort());
  $("#c-logprobs").checked = localStorage.getItem(CHAT_STORE.logprobs) === "true";
  if ([...$("#c-format").options].some((o) => o.value === localStorage.getItem(CHAT_STORE.format))) {
    $("#c-format").value = localStorage.getItem(CHAT_STORE.format);
  }
  if (localStorage.getItem(CHAT_STORE.schema) !== null) $("#c-schema").value = localStorage.getItem(CHAT_STORE.schema);
  $("#c-logprobs").addEventListener("change", () => {
    localStorage.setItem(CHAT_STORE.logprobs, String($("#c-logprobs").checked));
    showChatControls();
  });
  $("#c-format").addEventListener("change", () => {
    localStorage.setItem(CHAT_STORE.format, $("#c-format").value);
    showChatControls();
  });
  $("#c-schema").addEventListener("input", () => {
    localStorage.setItem(CHAT_STORE.schema, $("#c-schema").value);
    checkSchema();
  });
  showChatControls();
  watchTokens($("#c-log"));
  $("#c-new").addEventListener("click", () => {
    state.chat = [];
    hideTip();
    $("#c-log").replaceChildren();
    $("#c-stats").textContent = "";
    showError($("#c-error"), null);
  });
  renderHistory();
  loadModels();
  setInterval(() => {
    if ($("#panel-server").hidden) return;
    refreshServer();
    if (document.visibilityState === "visible") refreshBatches();
  }, 2000);
  document.body.dataset.ready = "true";
}

document.addEventListener("DOMContentLoaded", start);
