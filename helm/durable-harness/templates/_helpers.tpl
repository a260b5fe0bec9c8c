{{/* Names and labels. */}}
{{- define "harness.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "harness.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "harness.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' own labels: the pods' plus helm.sh/chart. */}}
{{- define "harness.labels" -}}
helm.sh/chart: {{ include "harness.chart" . }}
{{ include "harness.podLabels" . }}
{{- end -}}

{{/* A pod template's labels. Not helm.sh/chart: a change of a pod template rolls every pod
(for workers, a rebalance per pod), and a new chart version alone changes nothing the pods
run. app.kubernetes.io/version stays: it is the image's tag, so it changes only with the
image, which rolls the pods anyway, and it lets one select the pods of a version. */}}
{{- define "harness.podLabels" -}}
{{ include "harness.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: durable-harness
{{- end -}}

{{- define "harness.selectorLabels" -}}
app.kubernetes.io/name: {{ include "harness.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of one component: (dict "ctx" $ "component" "worker") */}}
{{- define "harness.componentLabels" -}}
{{ include "harness.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "harness.componentPodLabels" -}}
{{ include "harness.podLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The checksum/config annotation of the pod templates: the ConfigMap's data only (its labels
hold helm.sh/chart, which would roll the pods at every chart release). */}}
{{- define "harness.configChecksum" -}}
{{- (include (print .Template.BasePath "/configmap.yaml") . | fromYaml).data | toYaml | sha256sum -}}
{{- end -}}

{{- define "harness.componentSelector" -}}
{{ include "harness.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "harness.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "harness.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "harness.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The session log URL (HARNESS_LOG). */}}
{{- define "harness.logUrl" -}}
{{- $k := .Values.kafka -}}
{{- $url := printf "kafka://%s?topic_prefix=%s&partitions=%d&replication_factor=%d" $k.bootstrap $k.topicPrefix (int $k.partitions) (int $k.replicationFactor) -}}
{{- if $k.minInsyncReplicas -}}
{{- $url = printf "%s&min_insync_replicas=%d" $url (int $k.minInsyncReplicas) -}}
{{- end -}}
{{- $url -}}
{{- end -}}

{{/* Kafka ports the pods may reach when egress is restricted: networkPolicy.kafkaPorts plus
the ports of kafka.bootstrap (a bootstrap on 9093 with the default [9092] left every pod
unable to reach the broker). Comma-separated, sorted, no duplicates. */}}
{{- define "harness.kafkaEgressPorts" -}}
{{- $ports := list -}}
{{- range .Values.networkPolicy.kafkaPorts -}}
{{- $ports = append $ports (int .) -}}
{{- end -}}
{{- range (splitList "," .Values.kafka.bootstrap) -}}
{{- $ports = append $ports (int (last (splitList ":" .))) -}}
{{- end -}}
{{- $ports | uniq | join "," -}}
{{- end -}}

{{/* Cross-field checks the schema cannot express; each fails with one line saying how to fix it. */}}
{{- define "harness.validate" -}}
{{- $k := .Values.kafka -}}
{{- if and .Values.worker.enabled (gt (int .Values.worker.replicas) (int $k.partitions)) -}}
{{- fail (printf "worker.replicas (%d) is above kafka.partitions (%d): a partition has one owner, so the extra workers would only idle; lower worker.replicas or raise kafka.partitions" (int .Values.worker.replicas) (int $k.partitions)) -}}
{{- end -}}
{{- if and .Values.worker.enabled (gt (add (int .Values.worker.drainTimeoutSeconds) 10) (int .Values.worker.terminationGracePeriodSeconds)) -}}
{{- fail (printf "worker.drainTimeoutSeconds (%d) needs worker.terminationGracePeriodSeconds of at least %d (the drain plus 10 s to close the producers and leave the group): raise the grace period or lower the drain" (int .Values.worker.drainTimeoutSeconds) (add (int .Values.worker.drainTimeoutSeconds) 10)) -}}
{{- end -}}
{{- if and $k.minInsyncReplicas (gt (int $k.minInsyncReplicas) (int $k.replicationFactor)) -}}
{{- fail "kafka.minInsyncReplicas must not be above kafka.replicationFactor" -}}
{{- end -}}
{{- if and $k.sasl.mechanism (not $k.sasl.existingSecret) -}}
{{- fail "kafka.sasl.mechanism is set but kafka.sasl.existingSecret is empty: name the Secret holding the SASL username and password" -}}
{{- end -}}
{{- if and $k.sasl.existingSecret (not $k.sasl.mechanism) -}}
{{- fail "kafka.sasl.existingSecret is set but kafka.sasl.mechanism is empty: set PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512" -}}
{{- end -}}
{{- if and $k.sasl.mechanism (not (hasPrefix "SASL_" $k.securityProtocol)) -}}
{{- fail "kafka.sasl.mechanism needs kafka.securityProtocol SASL_SSL (or SASL_PLAINTEXT)" -}}
{{- end -}}
{{- if and (hasPrefix "SASL_" $k.securityProtocol) (not $k.sasl.mechanism) (not (hasKey $k.config "sasl.mechanisms")) -}}
{{- fail (printf "kafka.securityProtocol %s needs kafka.sasl.mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512) and kafka.sasl.existingSecret; another mechanism (OAUTHBEARER, GSSAPI) goes in kafka.config.sasl.mechanisms" $k.securityProtocol) -}}
{{- end -}}
{{- if and $k.tls.existingSecret (not (hasSuffix "SSL" $k.securityProtocol)) -}}
{{- fail "kafka.tls.existingSecret needs kafka.securityProtocol SSL (or SASL_SSL): without it the connection is not TLS and the certificates are not used" -}}
{{- end -}}
{{- if and (or $k.tls.certKey $k.tls.keyKey) (not (and $k.tls.certKey $k.tls.keyKey)) -}}
{{- fail "kafka.tls.certKey and kafka.tls.keyKey go together (a client certificate and its key)" -}}
{{- end -}}
{{- if and (or $k.tls.certKey $k.tls.keyKey) (not $k.tls.existingSecret) -}}
{{- fail "kafka.tls.certKey/keyKey need kafka.tls.existingSecret" -}}
{{- end -}}
{{- range $key, $_ := $k.config -}}
{{- if regexMatch "(?i)(password|secret|sasl\\.username|private\\.key|key\\.password)" $key -}}
{{- fail (printf "kafka.config.%s looks like a credential: put it in a Secret (kafka.sasl.existingSecret / kafka.tls.existingSecret)" $key) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.gateway.ingress.enabled (not .Values.gateway.enabled) -}}
{{- fail "gateway.ingress.enabled needs gateway.enabled: without the gateway there is nothing to route to; enable the gateway or set gateway.ingress.enabled=false" -}}
{{- end -}}
{{- if and .Values.gateway.rateLimitReads (not .Values.gateway.rateLimit) -}}
{{- fail "gateway.rateLimitReads needs gateway.rateLimit (requests a second per tenant)" -}}
{{- end -}}
{{- $auth := .Values.gateway.auth -}}
{{- if and .Values.gateway.enabled (ne $auth.mode "open") (or (not $auth.existingSecret) (not $auth.secretKey)) -}}
{{- fail (printf "gateway.auth.mode %s needs gateway.auth.existingSecret and gateway.auth.secretKey (the file in that Secret)" $auth.mode) -}}
{{- end -}}
{{- if and .Values.gateway.enabled (not (has $auth.mode (list "jwt" "jwks"))) (or $auth.jwtIssuer $auth.jwtAudience $auth.tenantClaim) -}}
{{- fail (printf "gateway.auth.jwtIssuer, jwtAudience and tenantClaim apply to JWTs only (gateway.auth.mode jwt or jwks), not to mode %s: the gateway refuses them there; leave them empty" $auth.mode) -}}
{{- end -}}
{{- if and .Values.gateway.enabled .Values.gateway.ingress.enabled (eq $auth.mode "open") (not $auth.allowOpenIngress) -}}
{{- fail "the gateway has no authentication (gateway.auth.mode open) and an Ingress would expose it: set gateway.auth.mode, or gateway.auth.allowOpenIngress=true if you really mean it" -}}
{{- end -}}
{{- if and .Values.gateway.enabled (eq (int .Values.gateway.port) (int .Values.metrics.port)) -}}
{{- fail (printf "gateway.port (%d) is metrics.port too: the gateway serves /metrics on its own port, so give gateway.port or metrics.port another value" (int .Values.gateway.port)) -}}
{{- end -}}
{{- if not (or .Values.worker.enabled .Values.gateway.enabled) -}}
{{- fail "worker.enabled and gateway.enabled are both false: nothing to deploy" -}}
{{- end -}}
{{- if and .Values.gateway.enabled (eq $auth.mode "open") (has .Values.gateway.service.type (list "LoadBalancer" "NodePort")) (not $auth.allowOpenIngress) -}}
{{- fail (printf "the gateway has no authentication (gateway.auth.mode open) and a %s Service would expose it outside the cluster: set gateway.auth.mode, or gateway.auth.allowOpenIngress=true if you really mean it" .Values.gateway.service.type) -}}
{{- end -}}
{{- $full := include "harness.fullname" . -}}
{{- if .Values.fullnameOverride -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" .Values.fullnameOverride) -}}
{{- fail (printf "fullnameOverride %q is not a Kubernetes name: use lower-case letters, digits and '-', starting and ending with a letter or digit" .Values.fullnameOverride) -}}
{{- end -}}
{{- end -}}
{{- if gt (len $full) 45 -}}
{{- fail (printf "the names of this release start with %q (%d characters): with their suffixes (-gateway, -worker and a StatefulSet pod's 11-character revision hash) they pass Kubernetes' 63; set fullnameOverride to at most 45 characters, or use a shorter release name" $full (len $full)) -}}
{{- end -}}
{{- if and .Values.worker.enabled (eq .Values.worker.kind "Deployment") .Values.worker.staticMembership -}}
{{- fail "worker.kind Deployment gives pods new names on every restart, so worker.staticMembership (the pod name as Kafka's group.instance.id) would leave each restarted pod's old id holding partitions until its session times out: set worker.staticMembership=false, or keep worker.kind StatefulSet" -}}
{{- end -}}
{{- $g := .Values.gateway -}}
{{- if and $g.enabled $g.autoscaling.enabled (gt (int $g.autoscaling.minReplicas) (int $g.autoscaling.maxReplicas)) -}}
{{- fail (printf "gateway.autoscaling.minReplicas (%d) is above gateway.autoscaling.maxReplicas (%d): the API server refuses such an autoscaler" (int $g.autoscaling.minReplicas) (int $g.autoscaling.maxReplicas)) -}}
{{- end -}}
{{- range (splitList "," .Values.kafka.bootstrap) -}}
{{- $port := int (last (splitList ":" .)) -}}
{{- if or (lt $port 1) (gt $port 65535) -}}
{{- fail (printf "kafka.bootstrap %q: port %d is not a TCP port (1 to 65535)" . $port) -}}
{{- end -}}
{{- end -}}
{{- $secretNames := dict -}}
{{- range .Values.appSecrets.env -}}
{{- if not (regexMatch "^[A-Za-z0-9_]+$" .name) -}}
{{- fail (printf "appSecrets.env name %q: a secret's name is letters, digits and '_' (it becomes HARNESS_SECRET_<NAME>, and tools read it as ctx.secrets[%q])" .name (lower .name)) -}}
{{- end -}}
{{- $key := lower .name -}}
{{- if hasKey $secretNames $key -}}
{{- fail (printf "appSecrets.env names %q twice (names are not case-sensitive: tools read ctx.secrets[%q]): give each secret its own name" .name $key) -}}
{{- end -}}
{{- $_ := set $secretNames $key true -}}
{{- end -}}
{{- end -}}

{{/* Environment shared by workers and gateways: the Kafka credentials (the rest is in the ConfigMap).
App secrets are not here: only workers read them (harness.appSecretEnv). */}}
{{- define "harness.kafkaCredentialEnv" -}}
{{- $k := .Values.kafka -}}
{{- if $k.sasl.existingSecret }}
- name: HARNESS_KAFKA_CONFIG_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $k.sasl.existingSecret }}
      key: {{ $k.sasl.usernameKey }}
- name: HARNESS_KAFKA_CONFIG_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $k.sasl.existingSecret }}
      key: {{ $k.sasl.passwordKey }}
{{- end }}
{{- end -}}

{{/* App secrets (model API keys ...) as HARNESS_SECRET_<NAME>: the workers' only. The worker
gives them to its sessions' tools and model calls; the gateway never calls a model nor runs a
tool and never reads HARNESS_SECRET_* (least privilege: a gateway pod cannot leak them). */}}
{{- define "harness.appSecretEnv" -}}
{{- range .Values.appSecrets.env }}
- name: {{ printf "HARNESS_SECRET_%s" (.name | upper | replace "-" "_" | replace "." "_") }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .key }}
{{- end }}
{{- end -}}

{{- define "harness.kafkaTlsVolume" -}}
{{- if .Values.kafka.tls.existingSecret }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{- define "harness.kafkaTlsMount" -}}
{{- if .Values.kafka.tls.existingSecret }}
- name: kafka-tls
  mountPath: /var/run/harness/kafka-tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* The worker container's env entries (may be none). */}}
{{- define "harness.workerEnv" -}}
{{- if $.Values.worker.staticMembership }}
- name: HARNESS_INSTANCE_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end }}
{{- if gt (int $.Values.worker.maxSessions) 0 }}
- name: HARNESS_MAX_SESSIONS
  value: {{ $.Values.worker.maxSessions | quote }}
{{- end }}
- name: HARNESS_DRAIN_TIMEOUT_SECONDS
  value: {{ $.Values.worker.drainTimeoutSeconds | quote }}
{{- if gt (int $.Values.worker.syncThreads) 0 }}
- name: HARNESS_SYNC_THREADS
  value: {{ $.Values.worker.syncThreads | quote }}
{{- end }}
{{- if .Values.appSecrets.existingSecret }}
- name: HARNESS_SECRETS_DIR
  value: /var/run/harness/secrets
{{- end }}
{{- with (include "harness.kafkaCredentialEnv" . | trim) }}{{ . | nindent 0 }}{{- end }}
{{- with (include "harness.appSecretEnv" . | trim) }}{{ . | nindent 0 }}{{- end }}
{{- with $.Values.worker.extraEnv }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end -}}

{{/* The gateway container's env entries (may be none). */}}
{{- define "harness.gatewayEnv" -}}
{{- if .Values.gateway.allowedHosts }}
# (--allowed-hosts adds it: the kubelet's probes send the pod's IP as Host)
- name: HARNESS_POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}
{{- with (include "harness.kafkaCredentialEnv" . | trim) }}{{ . | nindent 0 }}{{- end }}
{{- with .Values.gateway.extraEnv }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end -}}

{{/* The gateway Deployment's replicas. Without the autoscaler: gateway.replicas. With it, the
count the autoscaler set is kept: the live Deployment's, read with lookup at upgrade and written
back unchanged (the same value, so Helm 4's server-side apply sees no conflict with the
autoscaler's ownership; a new minReplicas/maxReplicas is the autoscaler's to apply). At install
(nothing to look up; also `helm template`): minReplicas. Not omitted: an omitted replicas
starts a new Deployment at 1 until the autoscaler acts, and omitting a field the previous
release set makes helm's three-way merge delete it, which scales the gateways down to 1 at
that upgrade. */}}
{{- define "harness.gatewayReplicas" -}}
{{- $g := .Values.gateway -}}
{{- if not $g.autoscaling.enabled -}}
{{- $g.replicas -}}
{{- else -}}
{{- $live := lookup "apps/v1" "Deployment" .Release.Namespace (printf "%s-gateway" (include "harness.fullname" .)) -}}
{{- $current := dig "spec" "replicas" nil $live -}}
{{- if kindIs "invalid" $current -}}
{{- int $g.autoscaling.minReplicas -}}
{{- else -}}
{{- int $current -}}
{{- end -}}
{{- end -}}
{{- end -}}
