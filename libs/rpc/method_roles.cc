#include "tandem/rpc/method_roles.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tandem/common/logging.h"

namespace tandem::rpc {
namespace {

std::vector<MethodRoles> BuildTable() {
  constexpr CallerRole kWorker = CallerRole::kWorker;
  constexpr CallerRole kScheduler = CallerRole::kScheduler;
  constexpr CallerRole kFrontend = CallerRole::kFrontend;
  constexpr CallerRole kClient = CallerRole::kClient;
  auto only = [](std::string_view path, std::vector<CallerRole> roles) {
    return MethodRoles{.path = path, .any_verified_peer = false, .roles = std::move(roles)};
  };
  auto open = [](std::string_view path) {
    return MethodRoles{.path = path, .any_verified_peer = true, .roles = {}};
  };
  return {
      // The worker runs steps for its scheduler and nobody else.
      only("/tandem.v1.Worker/Execute", {kScheduler}),
      only("/tandem.v1.Worker/Describe", {kScheduler}),
      // Generation: the frontend, and operators' tools with a client certificate.
      only("/tandem.v1.Generation/Generate", {kFrontend, kClient}),
      only("/tandem.v1.Generation/Abort", {kFrontend, kClient}),
      only("/tandem.v1.Generation/GetModelInfo", {kFrontend, kClient}),
      only("/tandem.v1.Generation/GetStats", {kFrontend, kClient}),
      // KV-store (DESIGN §5 as issue 16 amends it): workers Load (which
      // carries their corrupt-block reports) and Store; schedulers Lookup and
      // Release; both create namespaces and read Stats.
      only("/tandem.v1.KvStore/CreateNamespace", {kWorker, kScheduler}),
      only("/tandem.v1.KvStore/Lookup", {kScheduler}),
      only("/tandem.v1.KvStore/Load", {kWorker}),
      only("/tandem.v1.KvStore/Store", {kWorker}),
      only("/tandem.v1.KvStore/Release", {kScheduler}),
      only("/tandem.v1.KvStore/Stats", {kWorker, kScheduler}),
      // Probes and reflection: any certificate the CA signed.
      open("/grpc.health.v1.Health/Check"),
      open("/grpc.health.v1.Health/Watch"),
      open("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"),
  };
}

}  // namespace

const std::vector<MethodRoles>& MethodRoleTable() {
  static const std::vector<MethodRoles>* table = new std::vector<MethodRoles>(BuildTable());
  return *table;
}

const MethodRoles* FindMethodRoles(std::string_view path) {
  for (const MethodRoles& m : MethodRoleTable()) {
    if (m.path == path) return &m;
  }
  return nullptr;
}

bool MayCall(std::string_view path, CallerRole role) {
  if (role == CallerRole::kUnverified) return true;
  const MethodRoles* rule = FindMethodRoles(path);
  if (rule == nullptr) return false;
  if (rule->any_verified_peer) return true;
  for (CallerRole r : rule->roles) {
    if (r == role) return true;
  }
  return false;
}

grpc::Status AuthorizeMethod(std::string_view path, CallerRole role, std::string_view peer) {
  if (MayCall(path, role)) return grpc::Status::OK;
  const MethodRoles* rule = FindMethodRoles(path);
  std::string message;
  if (rule == nullptr) {
    message =
        absl::StrCat(std::string(path), " is in no role table (rpc/method_roles.h): refused to ",
                     std::string(peer));
  } else {
    std::string may;
    for (CallerRole r : rule->roles) {
      absl::StrAppend(&may, may.empty() ? "" : " or ", CallerRoleName(r));
    }
    message = absl::StrCat(std::string(path), " is for the ", may, " role; ", std::string(peer),
                           " has role '", CallerRoleName(role),
                           "' (a URI SAN spiffe://<trust domain>/tandem/<role> names it)");
  }
  TANDEM_LOG(WARNING) << "denied: " << message;
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, message);
}

grpc::Status RoleCheckProcessor::Process(const InputMetadata& auth_metadata,
                                         grpc::AuthContext* context,
                                         OutputMetadata* /*consumed_auth_metadata*/,
                                         OutputMetadata* /*response_metadata*/) {
  std::string_view path;
  if (auto it = auth_metadata.find(":path"); it != auth_metadata.end()) {
    path = std::string_view(it->second.data(), it->second.size());
  }
  std::vector<std::string> uris;
  CallerRole role = CallerRole::kNone;
  if (context != nullptr && context->IsPeerAuthenticated()) {
    for (const grpc::string_ref& v : context->FindPropertyValues(GRPC_PEER_URI_PROPERTY_NAME)) {
      uris.emplace_back(v.data(), v.size());
    }
    role = RoleFromUris(uris, trust_domain_);
    context->AddProperty(kRolePropertyName, CallerRoleName(role));
  }
  // The server demands a verified certificate, so an unauthenticated call
  // does not reach here; were it to, it has no role (kNone), not kUnverified.
  if (MayCall(path, role)) return grpc::Status::OK;  // the message only for refusals
  return AuthorizeMethod(path, role,
                         absl::StrCat("peer [", absl::StrJoin(uris, ", "),
                                      "] (roles read under trust domain ", trust_domain_, ")"));
}

}  // namespace tandem::rpc
