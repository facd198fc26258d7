// Triton's own C++ gRPC client library (the one perf_analyzer drives servers with) against
// drafthead-server's KServe v2 service. Built by tests/interop/build_triton_clients.sh from Triton's
// sources; not part of CI. Usage: triton_grpc_check HOST:PORT [MODEL]
//
// Checks, printing PASS/FAIL each (exit 1 if any failed): metadata and the statistics extension;
// unary Infer of every mode with FP32 input, every output requested (as perf_analyzer asks);
// a stream of 8 requests with triton_enable_empty_final_response, the 3rd malformed: answers in
// request order, the malformed one an error, every answer final and equal to the unary answer's
// bytes; UnregisterSystemSharedMemory of a name never registered; statistics counted.
#include <condition_variable>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "grpc_client.h"

namespace tc = triton::client;

namespace {

int failures = 0;

void Check(bool ok, const std::string& what, const std::string& detail = "") {
  std::cout << (ok ? "PASS " : "FAIL ") << what << (detail.empty() ? "" : ": " + detail) << "\n";
  if (!ok) ++failures;
}

bool Ok(const tc::Error& e, const std::string& what) {
  if (!e.IsOk()) Check(false, what, e.Message());
  return e.IsOk();
}

// The answer's outputs, name -> bytes.
std::map<std::string, std::string> Outputs(tc::InferResult* r) {
  std::map<std::string, std::string> out;
  for (const char* name : {"logits", "token_ids", "values", "probs"}) {
    const uint8_t* buf = nullptr;
    size_t n = 0;
    if (r->RawData(name, &buf, &n).IsOk()) out[name] = std::string(reinterpret_cast<const char*>(buf), n);
  }
  return out;
}

struct Request {
  std::unique_ptr<tc::InferInput> input;
  std::vector<std::unique_ptr<tc::InferRequestedOutput>> outputs;
  std::vector<tc::InferInput*> inputs() { return {input.get()}; }
  std::vector<const tc::InferRequestedOutput*> requested() {
    std::vector<const tc::InferRequestedOutput*> v;
    for (auto& o : outputs) v.push_back(o.get());
    return v;
  }
};

Request MakeRequest(const std::vector<float>& x, int64_t rows, int64_t k) {
  Request r;
  tc::InferInput* in;
  tc::InferInput::Create(&in, "hidden", {rows, k}, "FP32");
  r.input.reset(in);
  r.input->AppendRaw(reinterpret_cast<const uint8_t*>(x.data()), x.size() * sizeof(float));
  for (const char* name : {"logits", "token_ids", "values", "probs"}) {
    tc::InferRequestedOutput* o;
    tc::InferRequestedOutput::Create(&o, name);
    r.outputs.emplace_back(o);
  }
  return r;
}

void SetParams(tc::InferOptions* o, const std::vector<std::pair<std::string, std::pair<std::string, std::string>>>& p) {
  for (const auto& [name, tv] : p) o->request_parameters[name] = tc::RequestParameter{name, tv.second, tv.first};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: triton_grpc_check HOST:PORT [MODEL]\n";
    return 2;
  }
  const std::string url = argv[1], model = argc > 2 ? argv[2] : "drafthead";
  std::unique_ptr<tc::InferenceServerGrpcClient> client;
  if (!Ok(tc::InferenceServerGrpcClient::Create(&client, url), "create client")) return 1;

  inference::ServerMetadataResponse sm;
  if (Ok(client->ServerMetadata(&sm), "ServerMetadata")) {
    bool stats = false;
    for (const auto& e : sm.extensions()) stats |= e == "statistics";
    Check(stats, "ServerMetadata lists statistics", sm.ShortDebugString());
  }
  inference::ModelMetadataResponse mm;
  if (!Ok(client->ModelMetadata(&mm, model), "ModelMetadata")) return 1;
  const int64_t K = mm.inputs(0).shape(1), rows = 5;
  std::mt19937 gen(20);
  std::normal_distribution<float> normal;
  std::vector<float> x(rows * K);
  for (float& v : x) v = normal(gen);

  inference::ModelStatisticsResponse before, after;
  Ok(client->ModelInferenceStatistics(&before, model), "ModelStatistics (before)");

  // Unary, every mode, the way perf_analyzer sends --request-parameter (string / int / bool).
  const std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::pair<std::string, std::string>>>>> modes = {
      {"full_logits", {}},
      {"top_k", {{"mode", {"string", "top_k"}}, {"top_k", {"int", "8"}}, {"return_probs", {"bool", "true"}}}},
      {"argmax", {{"mode", {"string", "argmax"}}}},
      {"sample", {{"mode", {"string", "sample"}}, {"temperature", {"int", "1"}}, {"seed", {"int", "7"}}}}};
  std::map<std::string, std::map<std::string, std::string>> unary;
  int unary_ok = 0;
  for (const auto& [mode, params] : modes) {
    Request req = MakeRequest(x, rows, K);
    tc::InferOptions options(model);
    SetParams(&options, params);
    tc::InferResult* result = nullptr;
    const tc::Error e = client->Infer(&result, options, req.inputs(), req.requested());
    std::unique_ptr<tc::InferResult> owned(result);
    if (!Ok(e, "Infer " + mode) || !Ok(result->RequestStatus(), "Infer " + mode + " status")) continue;
    unary[mode] = Outputs(result);
    ++unary_ok;
    std::string names;
    for (const auto& [n, b] : unary[mode]) names += n + "(" + std::to_string(b.size()) + ") ";
    Check(!unary[mode].empty(), "Infer " + mode, names);
  }

  // A stream, as perf_analyzer --streaming drives it, with the 3rd request malformed.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<tc::InferResult>> answers;
  if (Ok(client->StartStream([&](tc::InferResult* r) {
           std::lock_guard<std::mutex> l(mu);
           answers.emplace_back(r);
           cv.notify_all();
         }),
         "StartStream")) {
    const int n = 8;
    for (int i = 0; i < n; ++i) {
      Request req = MakeRequest(x, rows, K);
      tc::InferOptions options(model);
      options.request_id_ = "s-" + std::to_string(i);
      options.triton_enable_empty_final_response_ = true;
      SetParams(&options, {{"mode", {"string", i == 2 ? "beam" : "top_k"}}, {"top_k", {"int", "8"}},
                           {"return_probs", {"bool", "true"}}});
      Ok(client->AsyncStreamInfer(options, req.inputs(), req.requested()), "AsyncStreamInfer");
    }
    std::unique_lock<std::mutex> l(mu);
    cv.wait_for(l, std::chrono::seconds(60), [&] { return answers.size() >= static_cast<size_t>(n); });
    Check(answers.size() == static_cast<size_t>(n), "stream: one answer per request", std::to_string(answers.size()));
    std::string order;
    bool in_order = true, all_final = true, equal = true, refused = false;
    for (size_t i = 0; i < answers.size(); ++i) {
      std::string id;
      answers[i]->Id(&id);
      order += id + " ";
      in_order &= id == "s-" + std::to_string(i);
      bool final_response = false;
      answers[i]->IsFinalResponse(&final_response);
      all_final &= final_response;
      const tc::Error status = answers[i]->RequestStatus();
      if (i == 2) {
        refused = !status.IsOk();
        std::cout << "     the malformed request's answer: " << status.Message() << "\n";
      } else {
        equal &= status.IsOk() && Outputs(answers[i].get()) == unary["top_k"];
      }
    }
    Check(in_order, "stream: answers in request order", order);
    Check(refused, "stream: the malformed request is answered with its error, in its place");
    Check(all_final, "stream: every answer carries triton_final_response = true");
    Check(equal, "stream: answers equal the unary top_k answer byte for byte");
    l.unlock();
    client->StopStream();
  }

  Ok(client->UnregisterSystemSharedMemory("never-registered"), "UnregisterSystemSharedMemory(unknown name)") &&
      (Check(true, "UnregisterSystemSharedMemory(unknown name) is OK"), true);

  if (Ok(client->ModelInferenceStatistics(&after, model), "ModelStatistics (after)") && before.model_stats_size() == 1 &&
      after.model_stats_size() == 1) {
    const auto& b = before.model_stats(0);
    const auto& a = after.model_stats(0);
    const uint64_t ok = a.inference_stats().success().count() - b.inference_stats().success().count();
    const uint64_t fail = a.inference_stats().fail().count() - b.inference_stats().fail().count();
    Check(ok == static_cast<uint64_t>(unary_ok + 7) && a.inference_count() - b.inference_count() == ok,
          "statistics: successes counted", std::to_string(ok));
    std::cout << "     statistics delta: success " << ok << ", fail " << fail << ", executions "
              << a.execution_count() - b.execution_count() << ", queue ns "
              << a.inference_stats().queue().ns() - b.inference_stats().queue().ns() << ", compute_infer ns "
              << a.inference_stats().compute_infer().ns() - b.inference_stats().compute_infer().ns() << "\n";
  }
  std::cout << (failures == 0 ? "ALL PASSED" : std::to_string(failures) + " FAILED") << "\n";
  return failures == 0 ? 0 : 1;
}
