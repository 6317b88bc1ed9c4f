// Builds Kueue's manager for the test control plane.
module wdrf.local/tools/kueue

go 1.26.0

tool sigs.k8s.io/kueue/cmd/kueue

require sigs.k8s.io/kueue v0.19.2
