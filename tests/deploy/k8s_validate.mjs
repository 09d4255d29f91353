// Validates Kubernetes objects with the kubernetes-models packages from npm.
//   node k8s_validate.mjs NODE_MODULES OBJECTS.json
// OBJECTS.json: [{"source": "...", "object": {...}}, ...]. Prints one line per
// object; exits 1 if any fails, 2 if an object's kind has no model.
import { readFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [nodeModules, objectsFile] = process.argv.slice(2);
// API group -> package. The core group ("v1") and the built-in groups are in
// kubernetes-models.
const PACKAGES = {
  "monitoring.coreos.com": "@kubernetes-models/prometheus-operator",
  "keda.sh": "@kubernetes-models/keda",
  "cert-manager.io": "@kubernetes-models/cert-manager",
};

let failed = 0, unknown = 0;
for (const { source, object } of JSON.parse(readFileSync(objectsFile, "utf8"))) {
  const { apiVersion, kind } = object;
  const group = apiVersion.includes("/") ? apiVersion.split("/")[0] : "";
  const pkg = PACKAGES[group] ?? "kubernetes-models";
  const file = join(nodeModules, pkg, apiVersion, `${kind}.js`);
  const name = `${source}: ${apiVersion} ${kind} ${object.metadata?.name}`;
  if (!existsSync(file)) {
    console.log(`NO MODEL ${name} (${file})`);
    unknown++;
    continue;
  }
  const Model = (await import(pathToFileURL(file).href))[kind];
  try {
    new Model(object).validate();
    console.log(`ok ${name}`);
  } catch (e) {
    console.log(`INVALID ${name}: ${e.message}`);
    failed++;
  }
}
process.exit(unknown ? 2 : failed ? 1 : 0);
