import { formOfRequest, keyOfField, profileNameProblem } from '../src/profiles';
import { INewSession, requestOf } from '../src/sessionRequest';

/** The form's fields as `NewSessionForm.fieldKinds` gives them (true: one item a line). */
const FIELDS: Record<string, boolean> = {
  name: false, launcher: false, hosts: false, nodes: false, kind: false, count: false,
  backend: false, rayAddress: false, rayStrategy: false, rayCpus: false, rayGpus: false,
  rayRuntimeEnv: false, rayResources: false, k8sNamespace: false, k8sContext: false, k8sImage: false,
  k8sCpus: false, k8sMemory: false, k8sNodeSelectors: true, k8sTolerations: true,
  k8sPodTemplate: false, k8sCallback: false, k8sTimeout: false, k8sQueue: false,
  k8sGpuResource: false
};

const BLANK: INewSession = {
  name: '', launcher: 'local', hosts: '', nodes: '', kind: 'procs', count: '', backend: ''
};

describe("a profile's request in the new-session form", () => {
  it('finds the key each field of a launcher sets by asking requestOf', () => {
    expect(keyOfField('k8sNamespace', 'k8s')).toBe('namespace');
    expect(keyOfField('k8sNodeSelectors', 'k8s')).toBe('node_selector');
    expect(keyOfField('rayRuntimeEnv', 'ray')).toBe('runtime_env');
    expect(keyOfField('rayCpus', 'k8s')).toBeNull(); // Ray's field sets nothing of Kubernetes'
    expect(keyOfField('nodes', 'k8s')).toBeNull();
  });

  it('fills the fields a Kubernetes profile sets, and what it sends is the profile again', () => {
    const request = {
      launcher: 'k8s', nodes: 2, gpus: [4, 2],
      k8s: {
        namespace: 'ml', node_selector: ['a=b', 'c=d'], timeout: 600, queue: 'team',
        priority_class: 'high'
      }
    };
    const { values, elsewhere } = formOfRequest(request, FIELDS);
    expect(values).toEqual({
      launcher: 'k8s', nodes: '2', kind: 'gpus', count: '4,2', k8sNamespace: 'ml',
      k8sNodeSelectors: 'a=b\nc=d', k8sTimeout: '600', k8sQueue: 'team'
    });
    expect(elsewhere).toEqual(['k8s.priority_class=high']); // no field here: named, sent by name
    const form = { ...BLANK, ...values, name: 'x', profile: 'pods' } as INewSession;
    expect(requestOf(form)).toEqual({
      name: 'x', profile: 'pods', launcher: 'k8s', nodes: 2, gpus: [4, 2],
      k8s: { namespace: 'ml', node_selector: ['a=b', 'c=d'], timeout: 600, queue: 'team' }
    });
  });

  it('fills a Ray profile, and names the top-level fields the form has no field for', () => {
    const request = {
      launcher: 'ray', procs: 2, framework: 'none', name: 'from-profile',
      ray: {
        address: 'head:6379', strategy: 'PACK', runtime_env: '{"pip": ["einops"]}',
        resources: 'accelerator_type=A100'
      }
    };
    const { values, elsewhere } = formOfRequest(request, FIELDS);
    expect(values).toMatchObject({
      launcher: 'ray', name: 'from-profile', kind: 'procs', count: '2', rayAddress: 'head:6379',
      rayStrategy: 'PACK', rayRuntimeEnv: '{"pip": ["einops"]}', rayResources: 'accelerator_type=A100'
    });
    expect(elsewhere).toEqual(['framework=none']);
  });

  it("checks a profile's name as the server does", () => {
    expect(profileNameProblem('gpu-pods')).toBe('');
    expect(profileNameProblem('')).toContain('expected the name');
    expect(profileNameProblem('../x')).toContain("'../x': expected 1-64 letters");
  });
});
