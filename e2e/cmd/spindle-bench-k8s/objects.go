package main

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// benchLabel marks every object the benchmark makes.
const benchLabel = "spindle.csi.dev/bench"

// claim is one pod's PVC: ReadWriteOnce, a filesystem of the class's type.
func (b *bench) claim(name string) *corev1.PersistentVolumeClaim {
	mode := corev1.PersistentVolumeFilesystem
	class := b.o.storageClass
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.o.namespace, Labels: map[string]string{benchLabel: "true"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			VolumeMode:       &mode,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: b.o.size}},
		},
	}
}

// pod mounts its claim at /data and pauses, in the e2e tests' image; the
// scheduler places it (no nodeName), as it would a user's pod. It
// resolves no names: with the default dnsPolicy (ClusterFirst) on a
// cluster without cluster DNS, as the local one is, kubelet posts a
// MissingClusterDNS warning at every sync of every pod, some 500 events a
// run, load on the apiserver that has nothing to do with volumes.
func (b *bench) pod(name string) *corev1.Pod {
	grace := int64(1)
	noToken := false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.o.namespace, Labels: map[string]string{benchLabel: "true"}},
		Spec: corev1.PodSpec{
			HostNetwork:                   b.o.hostNetwork,
			DNSPolicy:                     corev1.DNSDefault,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  &noToken,
			Containers: []corev1.Container{{
				Name: "bench", Image: b.o.image, ImagePullPolicy: corev1.PullNever, Args: []string{"pause"},
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				VolumeMounts:             []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name},
			}}},
		},
	}
	if !b.o.volumes {
		pod.Spec.Containers[0].VolumeMounts, pod.Spec.Volumes = nil, nil
	}
	return pod
}
