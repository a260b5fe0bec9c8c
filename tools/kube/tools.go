//go:build tools

// Package kube pins the Kubernetes control-plane commands the ops tests run
// (kube-apiserver, kube-controller-manager, kube-scheduler). k8s.io/kubernetes
// cannot be "go install"ed (its go.mod replaces the staging modules with local
// paths); this wrapper module replaces each one with its published version.
// Built by .ci/ops-tools.sh.
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
