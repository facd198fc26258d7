// The KServe v2 API from an independent gRPC implementation: Node's @grpc/grpc-js with
// @grpc/proto-loader (protobufjs), reading proto/inference/grpc_service.proto as published, against
// a real drafthead-server (CPU, Gloo, tp=2, synthetic weights at tiny shapes). Every RPC; every
// mode's answer equal bit for bit to the native API's (drafthead.v1, also through grpc-js); the
// bad-input cases; a stream with a bad request in the middle. Run by kserve_node_test.sh, which
// installs the two packages; exits non-zero on the first failure.
'use strict';

const assert = require('node:assert/strict');
const childProcess = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const SRC = process.env.DRAFTHEAD_SOURCE_DIR;
const BIN = process.env.DRAFTHEAD_BIN_DIR;
const K = 256, PADDED = 4096, VOCAB = 4000, MAX_ROWS = 16;
const CALL_S = 60;  // every call's deadline

function load(file) {
  const def = protoLoader.loadSync(file, {
    includeDirs: [path.join(SRC, 'proto')], keepCase: true, longs: String, enums: String,
    defaults: true, oneofs: true,
  });
  return grpc.loadPackageDefinition(def);
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = s.address().port;
      s.close(() => resolve(port));
    });
  });
}

const deadline = () => new Date(Date.now() + CALL_S * 1000);

// A unary call as a promise: resolves to {err, resp}.
function call(client, method, req) {
  return new Promise((resolve) => {
    client[method](req, {deadline: deadline()}, (err, resp) => resolve({err, resp}));
  });
}

async function ok(client, method, req) {
  const {err, resp} = await call(client, method, req);
  if (err) throw new Error(`${method}: ${err.code} ${err.details}`);
  return resp;
}

// Seeded hidden states (bf16 bits of N(0,1)-ish values), so every run sends the same rows.
function hiddenBf16(rows, seed) {
  const buf = Buffer.alloc(rows * K * 2);
  const f = new Float32Array(1), u = new Uint32Array(f.buffer);
  let s = seed >>> 0;
  for (let i = 0; i < rows * K; ++i) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    f[0] = (s / 4294967296 - 0.5) * 4;
    buf.writeUInt16LE(u[0] >>> 16, i * 2);  // truncation: any bf16 will do
  }
  return buf;
}

function bf16ToFp32(bf16) {
  const out = Buffer.alloc(bf16.length * 2);
  for (let i = 0; i < bf16.length / 2; ++i) out.writeUInt32LE(bf16.readUInt16LE(i * 2) << 16 >>> 0, i * 4);
  return out;
}

const param = {
  s: (v) => ({string_param: v}), i: (v) => ({int64_param: String(v)}), u: (v) => ({uint64_param: String(v)}),
  d: (v) => ({double_param: v}), b: (v) => ({bool_param: v}),
};

function inferRequest({rows = 3, hidden, datatype = 'BF16', params = {}, outputs = [], id = '', model = 'drafthead',
                       version = ''}) {
  return {
    model_name: model, model_version: version, id, parameters: params,
    inputs: [{name: 'hidden', datatype, shape: [String(rows), String(K)]}],
    outputs: outputs.map((name) => ({name})), raw_input_contents: [hidden],
  };
}

const f32Bytes = (a) => Buffer.from(new Float32Array(a).buffer);
const i32Bytes = (a) => Buffer.from(new Int32Array(a).buffer);

// The KServe answer equals the native one bit for bit: each named output's raw bytes.
function assertSameAnswer(kserve, native, rows, label) {
  const got = {};
  kserve.outputs.forEach((o, i) => { got[o.name] = {o, raw: kserve.raw_output_contents[i]}; });
  if (native.logits.length > 0) {
    assert.deepEqual(Object.keys(got), ['logits'], label);
    assert.deepEqual(got.logits.o.shape, [String(rows), String(VOCAB)], label);
    assert.equal(got.logits.o.datatype, native.logits_dtype === 'FP32' ? 'FP32' : 'BF16', label);
    assert.ok(got.logits.raw.equals(native.logits), `${label}: logits differ`);
    return;
  }
  const k = native.token_ids.length / rows;
  assert.ok(got.token_ids.raw.equals(i32Bytes(native.token_ids)), `${label}: token_ids differ`);
  assert.ok(got.values.raw.equals(f32Bytes(native.values)), `${label}: values differ`);
  assert.deepEqual(got.token_ids.o.shape, [String(rows), String(k)], label);
  assert.equal(got.token_ids.o.datatype, 'INT32', label);
  if (native.probs.length > 0) assert.ok(got.probs.raw.equals(f32Bytes(native.probs)), `${label}: probs differ`);
  else assert.equal(got.probs, undefined, label);
}

async function expectError(kserve, req, code, prefix) {
  const {err} = await call(kserve, 'ModelInfer', req);
  assert.ok(err, `accepted a request that should fail with ${prefix}`);
  assert.equal(err.code, code, `${prefix}: code ${err.code} ${err.details}`);
  assert.ok(err.details.startsWith(prefix), `message '${err.details}' should start with '${prefix}'`);
}

async function main() {
  const inference = load(path.join(SRC, 'proto/inference/grpc_service.proto')).inference;
  const v1 = load(path.join(SRC, 'proto/drafthead/v1/drafthead.proto')).drafthead.v1;
  const port = await freePort();
  const target = `127.0.0.1:${port}`;
  const logPath = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'dh-kserve-node-')), 'server.log');
  const log = fs.openSync(logPath, 'w');
  const server = childProcess.spawn(path.join(BIN, 'server', 'drafthead-server'), [
    '--synthetic=1', `--hidden-size=${K}`, `--padded-vocab=${PADDED}`, `--vocab-size=${VOCAB}`, '--tp=2',
    '--backend=cpu', '--comm=gloo', `--listen=${target}`, `--max-rows=${MAX_ROWS}`, '--keep-bf16'],
  {stdio: ['ignore', log, log]});
  let serverExited = false;
  server.on('exit', () => { serverExited = true; });
  const opts = {'grpc.max_receive_message_length': 64 << 20};
  const kserve = new inference.GRPCInferenceService(target, grpc.credentials.createInsecure(), opts);
  const native = new v1.DraftHead(target, grpc.credentials.createInsecure(), opts);
  try {
    // ---- liveness and readiness: ready once the group serves.
    const waitUntil = Date.now() + 120000;
    for (;;) {
      assert.ok(!serverExited, `server exited:\n${fs.readFileSync(logPath, 'utf8').slice(-3000)}`);
      const {err, resp} = await call(kserve, 'ServerReady', {});
      if (!err && resp.ready) break;
      assert.ok(Date.now() < waitUntil, 'server not ready in 120 s');
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal((await ok(kserve, 'ServerLive', {})).live, true);
    assert.equal((await ok(kserve, 'ModelReady', {name: 'drafthead', version: '1'})).ready, true);
    assert.equal((await call(kserve, 'ModelReady', {name: 'other'})).err.code, grpc.status.NOT_FOUND);

    // ---- metadata and configuration.
    const sm = await ok(kserve, 'ServerMetadata', {});
    assert.equal(sm.name, 'drafthead');
    assert.deepEqual(sm.extensions, ['model_configuration', 'parameters', 'statistics']);
    const mm = await ok(kserve, 'ModelMetadata', {name: 'drafthead'});
    assert.deepEqual(mm.versions, ['1']);
    assert.deepEqual(mm.inputs, [{name: 'hidden', datatype: 'BF16', shape: ['-1', String(K)]}]);
    assert.deepEqual(mm.outputs.map((o) => o.name), ['logits', 'token_ids', 'values', 'probs']);
    assert.deepEqual(mm.outputs[0].shape, ['-1', String(VOCAB)]);
    assert.equal((await call(kserve, 'ModelMetadata', {name: 'drafthead', version: '2'})).err.code,
                 grpc.status.NOT_FOUND);
    const cfg = (await ok(kserve, 'ModelConfig', {name: 'drafthead'})).config;
    assert.equal(cfg.name, 'drafthead');
    assert.equal(cfg.max_batch_size, 0);
    assert.deepEqual(cfg.input.map((i) => [i.name, i.data_type, i.dims]), [['hidden', 'TYPE_BF16', ['-1', String(K)]]]);
    assert.deepEqual(cfg.output.map((o) => [o.name, o.data_type]),
                     [['logits', 'TYPE_BF16'], ['token_ids', 'TYPE_INT32'], ['values', 'TYPE_FP32'], ['probs', 'TYPE_FP32']]);
    assert.equal((await call(kserve, 'ModelConfig', {name: 'nope'})).err.code, grpc.status.NOT_FOUND);

    // ---- every mode: the same answer as the native API, bit for bit.
    const rows = 3, hidden = hiddenBf16(rows, 7);
    const cases = [
      {label: 'full_logits bf16', params: {}, nat: {}},
      {label: 'full_logits fp32', params: {logits_dtype: param.s('FP32')}, nat: {logits_dtype: 'FP32'}},
      {label: 'full_logits fp32 hidden', datatype: 'FP32', params: {mode: param.s('full_logits')}, nat: {}},
      {label: 'bf16_exact', params: {head: param.s('bf16_exact'), logits_dtype: param.s('FP32')},
       nat: {head: 'BF16_EXACT', logits_dtype: 'FP32'}},
      {label: 'top_k', params: {mode: param.s('top_k'), top_k: param.i(6)}, nat: {mode: 'TOP_K', top_k: 6}},
      {label: 'top_k probs', params: {mode: param.s('top_k'), top_k: param.u(5), return_probs: param.b(true),
                                      temperature: param.d(0.5)},
       nat: {mode: 'TOP_K', top_k: 5, return_probs: true, temperature: 0.5}},
      {label: 'argmax', params: {mode: param.s('argmax')}, nat: {mode: 'ARGMAX'}},
      {label: 'sample', params: {mode: param.s('sample'), temperature: param.d(0.75), seed: param.i(11)},
       nat: {mode: 'SAMPLE', temperature: 0.75, seed: '11'}},
      {label: 'sample uint64 seed', params: {mode: param.s('sample'), temperature: param.i(2),
                                             seed: param.u('18446744073709551615')},
       nat: {mode: 'SAMPLE', temperature: 2, seed: '18446744073709551615'}},
    ];
    for (const c of cases) {
      const body = c.datatype === 'FP32' ? bf16ToFp32(hidden) : hidden;
      const k = await ok(kserve, 'ModelInfer', inferRequest({rows, hidden: body, datatype: c.datatype, params: c.params,
                                                              id: c.label}));
      const n = await ok(native, 'ComputeLogits', {rows, hidden, ...c.nat});
      assert.equal(k.id, c.label);
      assert.equal(k.model_name, 'drafthead');
      assert.equal(k.model_version, '1');
      assertSameAnswer(k, n, rows, c.label);
      assert.ok('compute_us' in k.parameters, `${c.label}: timing parameters`);
    }
    // Requested outputs: in the order asked; what the mode does not make is left out.
    const sel = await ok(kserve, 'ModelInfer', inferRequest({rows, hidden, params: {mode: param.s('top_k'), top_k: param.i(4)},
                                                              outputs: ['values', 'logits', 'token_ids', 'probs']}));
    assert.deepEqual(sel.outputs.map((o) => o.name), ['values', 'token_ids']);

    // ---- bad input: INVALID_ARGUMENT naming the tensor or parameter; unknown model NOT_FOUND.
    const IA = grpc.status.INVALID_ARGUMENT;
    const bad = (over) => inferRequest({rows, hidden, ...over});
    const topk = (k) => ({mode: param.s('top_k'), top_k: param.i(k)});
    await expectError(kserve, bad({model: 'other'}), grpc.status.NOT_FOUND, "unknown model 'other'");
    await expectError(kserve, bad({version: '3'}), grpc.status.NOT_FOUND, "model 'drafthead' has no version");
    await expectError(kserve, bad({params: topk(0)}), IA, 'top_k:');
    await expectError(kserve, bad({params: topk(257)}), IA, 'top_k:');
    await expectError(kserve, bad({params: {mode: param.s('top_k'), top_k: param.i(-1)}}), IA, 'top_k:');
    await expectError(kserve, bad({params: {mode: param.s('sample'), temperature: param.d(0)}}), IA, 'temperature:');
    await expectError(kserve, bad({params: {mode: param.s('sample'), temperature: param.d(NaN)}}), IA, 'temperature:');
    await expectError(kserve, bad({params: {mode: param.s('beam')}}), IA, 'mode:');
    await expectError(kserve, bad({params: {mode: param.i(1)}}), IA, 'mode:');
    await expectError(kserve, bad({params: {head: param.s('fp4')}}), IA, 'head:');
    await expectError(kserve, bad({params: {logits_dtype: param.s('FP16')}}), IA, 'logits_dtype:');
    await expectError(kserve, bad({params: {seed: param.i(-5)}}), IA, 'seed:');
    await expectError(kserve, bad({params: {return_probs: param.s('yes')}}), IA, 'return_probs:');
    await expectError(kserve, bad({params: {topk: param.i(3)}}), IA, "parameters: unknown parameter 'topk'");
    await expectError(kserve, bad({outputs: ['scores']}), IA, "outputs: unknown output 'scores'");
    await expectError(kserve, bad({datatype: 'FP16'}), IA, 'hidden:');
    await expectError(kserve, inferRequest({rows: MAX_ROWS + 1, hidden: hiddenBf16(MAX_ROWS + 1, 1)}), IA, 'hidden:');
    const shortRow = inferRequest({rows, hidden});
    shortRow.inputs[0].shape = [String(rows), String(K - 1)];
    await expectError(kserve, shortRow, IA, 'hidden:');
    await expectError(kserve, bad({hidden: hidden.subarray(2)}), IA, 'hidden:');
    const nan = Buffer.from(hidden);
    nan.writeUInt16LE(0x7fc0, 2 * (K + 3));
    await expectError(kserve, bad({hidden: nan}), IA, 'hidden: non-finite value at row 1, column 3');
    const noRaw = bad({});
    noRaw.raw_input_contents = [];
    await expectError(kserve, noRaw, IA, 'hidden:');
    const renamed = bad({});
    renamed.inputs[0].name = 'x';
    await expectError(kserve, renamed, IA, "inputs: unknown input 'x'");

    // ---- a stream with a bad request in the middle: answered in-band, the stream goes on.
    const stream = kserve.ModelStreamInfer({deadline: deadline()});
    const answers = new Map();
    const ended = new Promise((resolve, reject) => {
      stream.on('data', (a) => answers.set(a.infer_response.id, a));
      stream.on('status', (st) => resolve(st));
      stream.on('error', reject);
    });
    stream.write(inferRequest({rows, hidden, id: 'a', params: topk(3)}));
    stream.write(inferRequest({rows, hidden, id: 'b', params: topk(0)}));
    stream.write(inferRequest({rows, hidden, id: 'c', params: {mode: param.s('argmax')}}));
    stream.end();
    assert.equal((await ended).code, grpc.status.OK);
    assert.deepEqual([...answers.keys()].sort(), ['a', 'b', 'c']);
    assert.ok(answers.get('b').error_message.startsWith('INVALID_ARGUMENT: top_k:'), answers.get('b').error_message);
    assertSameAnswer(answers.get('a').infer_response, await ok(native, 'ComputeLogits', {rows, hidden, mode: 'TOP_K', top_k: 3}),
                     rows, 'stream a');
    assertSameAnswer(answers.get('c').infer_response, await ok(native, 'ComputeLogits', {rows, hidden, mode: 'ARGMAX'}),
                     rows, 'stream c');
    assert.equal(answers.get('a').error_message, '');

    // ---- the shared-memory RPCs, with --shared-memory off: refused naming the flag.
    for (const rpc of ['SystemSharedMemoryStatus', 'SystemSharedMemoryRegister', 'SystemSharedMemoryUnregister',
                       'CudaSharedMemoryStatus', 'CudaSharedMemoryRegister', 'CudaSharedMemoryUnregister']) {
      const {err} = await call(kserve, rpc, {name: 'r', key: '/r', byte_size: '64'});
      assert.equal(err && err.code, grpc.status.FAILED_PRECONDITION, rpc);
      assert.ok(err.details.includes('--shared-memory'), `${rpc}: ${err.details}`);
    }
    const inShm = bad({});
    inShm.raw_input_contents = [];
    inShm.inputs[0].parameters = {shared_memory_region: param.s('r'), shared_memory_byte_size: param.i(rows * K * 2)};
    const off = await call(kserve, 'ModelInfer', inShm);
    assert.equal(off.err && off.err.code, grpc.status.FAILED_PRECONDITION);

    // Still serving after all that.
    await ok(kserve, 'ModelInfer', inferRequest({rows: 1, hidden: hiddenBf16(1, 2)}));
    console.log(`kserve_node_test: OK (grpc-js ${require('@grpc/grpc-js/package.json').version})`);
  } finally {
    kserve.close();
    native.close();
    server.kill('SIGTERM');
    const killer = setTimeout(() => server.kill('SIGKILL'), 30000);
    if (!serverExited) await new Promise((r) => server.on('exit', r));
    clearTimeout(killer);
  }
}

main().catch((e) => {
  console.error(`kserve_node_test: FAILED\n${e.stack || e}`);
  process.exit(1);
});
