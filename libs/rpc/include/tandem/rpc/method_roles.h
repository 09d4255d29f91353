// Which role may call which gRPC method (issue 29 item 3): one table for
// every method of every Tandem server, checked in one place.
//
// Under mutual TLS (--tls-ca on a server) ServerCredentialsFor installs
// RoleCheckProcessor, a gRPC AuthMetadataProcessor that runs for every call
// before any handler: it takes the caller's role from its certificate
// (RoleFromUris under --tls-trust-domain, tls.h), records it in the call's
// AuthContext (so RoleOf reads the same answer) and refuses with
// PERMISSION_DENIED a method the role may not call, or a method the table
// does not know. Without mutual TLS every caller is kUnverified and every
// method is open, as before.
//
// The table:
//   tandem.v1.Worker/*      scheduler (only the scheduler runs steps)
//   tandem.v1.Generation/*  frontend and client (the client role is for
//                           operators' tools: tandem CLI, tandem-generate)
//   tandem.v1.KvStore       Load, Store: worker; Lookup, Release: scheduler;
//                           CreateNamespace, Stats: worker and scheduler
//   grpc.health.v1.Health/*, grpc.reflection.v1alpha.ServerReflection/*:
//                           any verified certificate (probes use the part's
//                           own certificate)
// method_roles_test walks the descriptors of every service Tandem serves and
// fails when a method is missing here.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/support/status.h"
#include "tandem/rpc/tls.h"

namespace tandem::rpc {

struct MethodRoles {
  std::string_view path;           // the gRPC :path, "/tandem.v1.Worker/Execute"
  bool any_verified_peer = false;  // open to every certificate the CA signed
  std::vector<CallerRole> roles;   // else: only these roles
};

// The table, in the order above.
[[nodiscard]] const std::vector<MethodRoles>& MethodRoleTable();
// The rule for `path`; nullptr for a method the table does not know.
[[nodiscard]] const MethodRoles* FindMethodRoles(std::string_view path);

// Whether `role` may call `path`: always for kUnverified (no mutual TLS);
// else per the table, an unknown path refused.
[[nodiscard]] bool MayCall(std::string_view path, CallerRole role);
// OK when `role` may call `path`: always for kUnverified (no mutual TLS);
// else per the table, an unknown path refused. PERMISSION_DENIED names the
// method, the roles that may call it, `peer` and its role.
[[nodiscard]] grpc::Status AuthorizeMethod(std::string_view path, CallerRole role,
                                           std::string_view peer);

// The AuthContext property in which RoleCheckProcessor records the role.
inline constexpr char kRolePropertyName[] = "tandem_role";

// The role check for a server under mutual TLS (installed by
// ServerCredentialsFor). Non-blocking: it runs on gRPC's call path.
class RoleCheckProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit RoleCheckProcessor(std::string trust_domain) : trust_domain_(std::move(trust_domain)) {}
  [[nodiscard]] bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  std::string trust_domain_;
};

}  // namespace tandem::rpc
